#!/usr/bin/env python3
"""Point-to-point messages between pairs of ranks: shm against Gloo, interleaved.

    .venv/bin/torchrun --nproc_per_node=2 bench/bench_p2p.py [--sizes 8,4K,256K,1M,16M] [--json PATH]

Ranks pair up (0-1, 2-3, ...; an odd last rank sits out). At each size, float32, on shm (the default
group) and on a Gloo group over the same ranks, in turn:

  pingpong    dist.send then dist.recv on one side, dist.recv then dist.send on the other: half the round
              trip, what a message costs when the receiver waits for it (pipeline stages, handshakes)
  ipingpong   the same with isend / irecv and wait() on each
  stream      one side sends, the other receives, message after message: the time per message, and the
              GB/s one message after another moves (the channel's bandwidth)

us per message: the slowest rank's best of --rounds rounds (a round: --iters-time seconds of calls after a
barrier), and Gloo's time over shm's. Every message's contents are checked once per form.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from shmcoll_bench import script, timing
from shmcoll_bench.sweep import Ctrl, parse_bytes

FORMS = ("pingpong", "ipingpong", "stream")


def calls(nbytes: int, group, rank: int, world: int):
    """{form: one call of it on this rank}, and a check of what this rank last received."""
    peer = rank ^ 1 if (rank ^ 1) < world else None
    count = nbytes // 4
    mine = torch.arange(count, dtype=torch.float32) + 1000 * rank
    got = torch.empty(count, dtype=torch.float32)
    first = rank % 2 == 0

    def pingpong():
        if first:
            dist.send(mine, peer, group=group)
            dist.recv(got, peer, group=group)
        else:
            dist.recv(got, peer, group=group)
            dist.send(mine, peer, group=group)

    def ipingpong():
        if first:
            dist.isend(mine, peer, group=group).wait()
            dist.irecv(got, peer, group=group).wait()
        else:
            dist.irecv(got, peer, group=group).wait()
            dist.isend(mine, peer, group=group).wait()

    def stream():
        if first:
            dist.send(mine, peer, group=group)
        else:
            dist.recv(got, peer, group=group)

    def idle():
        pass

    def check(form: str) -> bool:
        if peer is None or (form == "stream" and first):
            return True
        return torch.equal(got, torch.arange(count, dtype=torch.float32) + 1000 * peer)

    forms = {"pingpong": pingpong, "ipingpong": ipingpong, "stream": stream}
    return {form: (fn if peer is not None else idle) for form, fn in forms.items()}, check


def main() -> int:
    p = script.parser(__doc__)
    script.add_best_round_options(p, sizes="8,4K,64K,256K,1M,16M")
    args = p.parse_args()
    job = script.start(args.threads)
    rank, world, groups = job.rank, job.world, job.groups
    if world < 2:
        raise SystemExit("bench_p2p.py needs at least 2 ranks")
    ctrl = Ctrl(job.ctrl)
    rows = []
    for nbytes in map(parse_bytes, args.sizes.split(",")):
        row = {"bytes": nbytes, "us": {}}
        for form in FORMS:
            for backend, group in groups.items():
                forms, check = calls(nbytes, group, rank, world)
                fn = forms[form]
                fn()
                if not ctrl.max([0.0 if check(form) else 1.0])[0] == 0.0:
                    raise SystemExit(f"{form} of {nbytes} bytes on {backend} delivered wrong data")
                per_call = timing.best_round(fn, ctrl, args.iters_time, args.rounds, warmup=10)
                # a ping-pong call is a round trip: two messages
                row["us"][f"{backend}/{form}"] = per_call * 1e6 / (2 if form != "stream" else 1)
        row["us"] = dict(zip(row["us"], ctrl.max(list(row["us"].values()))))  # the slowest rank's
        rows.append(row)
    if rank == 0:
        print(f"{world} ranks in pairs, {len(os.sched_getaffinity(0))} usable CPUs, torch {torch.__version__}; "
              f"float32, us per message (slowest rank, best of {args.rounds} rounds); Gloo over shm\n")
        print("| bytes | " + " | ".join(f"{form}: shm / Gloo" for form in FORMS) + " | stream GB/s: shm / Gloo |")
        print("|---:|" + "---|" * (len(FORMS) + 1))
        for row in rows:
            us = row["us"]
            cells = [f"{us[f'shm/{form}']:.1f} / {us[f'gloo/{form}']:.1f} ({us[f'gloo/{form}'] / us[f'shm/{form}']:.2f}x)"
                     for form in FORMS]
            rates = [row["bytes"] / us[f"{b}/stream"] / 1e3 for b in groups]
            print(f"| {row['bytes']} | " + " | ".join(cells) + f" | {rates[0]:.2f} / {rates[1]:.2f} |")
        script.write_json(args.json, {"bench": "p2p", "config": vars(args), "world_size": world,
                                      "torch": torch.__version__, "rows": rows})
    return script.finish(job.ctrl)


if __name__ == "__main__":
    sys.exit(main())
