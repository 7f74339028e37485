#!/usr/bin/env python3
"""Does an async all_reduce overlap with computation?  shm and gloo in one job.

    .venv/bin/torchrun --nproc_per_node=2 bench/bench_overlap.py --json results/overlap-2ranks.json
    .venv/bin/torchrun --nproc_per_node=2 bench/bench_overlap.py --threads 2   # matmul threads

For each backend (shm: the default group; gloo: ``new_group(backend="gloo")``) four ways of
doing the same work, each timed from a barrier to the end, on every rank:

  comm        all_reduce of --mib MiB of float32 (synchronous)
  compute     one --matmul x --matmul float32 matmul
  sequential  the all_reduce, then the matmul
  overlapped  ``work = all_reduce(async_op=True)``, the matmul, ``work.wait()``

Overlap pays off when "overlapped" is clearly below "sequential"; the best it can do is
max(comm, compute).  Time = the slowest rank's; median over --reps repetitions, which
interleave backends and modes (rep 1: shm comm, shm compute, ..., gloo overlapped; rep 2 ...).
The all-reduced buffer is checked after every call (a Work that completes early fails the run,
exit 3).

Read the result against the cores: overlap needs a core for the communication while the matmul
runs.  On the 2-core development machine 2 ranks already use both, so the progress thread
(shm) or Gloo's worker thread competes with the rank's own matmul and little or no gain is
expected; --threads > 1 makes it worse there (more threads than cores).  On a machine with
spare cores, the gain shows what each backend's asynchrony is worth.  Bookkeeping runs on a
separate gloo group.  Takes about 20 s at the defaults.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from shmcoll_bench import script

EXIT_WRONG = 3
MODES = ("comm", "compute", "sequential", "overlapped")


def main() -> int:
    p = script.parser(__doc__)
    p.add_argument("--mib", type=float, default=64, help="all_reduce size in MiB (default 64)")
    p.add_argument("--matmul", type=int, default=1024, help="matmul dimension (default 1024)")
    p.add_argument("--reps", type=int, default=7, help="repetitions (default 7)")
    args = p.parse_args()
    job = script.start(args.threads)
    rank, world, groups, ctrl = job.rank, job.world, job.groups, job.ctrl

    buf = torch.ones(int(args.mib * 2**20) // 4)
    a = torch.randn(args.matmul, args.matmul)
    b = torch.randn(args.matmul, args.matmul)

    def run(mode: str, group) -> None:
        if mode == "comm":
            dist.all_reduce(buf, group=group)
        elif mode == "compute":
            torch.mm(a, b)
        elif mode == "sequential":
            dist.all_reduce(buf, group=group)
            torch.mm(a, b)
        else:
            work = dist.all_reduce(buf, group=group, async_op=True)
            torch.mm(a, b)
            work.wait()

    def timed(mode: str, group) -> float:
        buf.fill_(1.0)
        dist.barrier(group=ctrl)
        start = time.perf_counter()
        run(mode, group)
        elapsed = time.perf_counter() - start
        if mode != "compute" and not (buf[0].item() == buf[-1].item() == world):
            raise AssertionError(f"rank {rank}: {mode} all_reduce left {buf[0].item()}, "
                                 f"{buf[-1].item()} (want {world}) after it completed")
        return elapsed

    try:
        for name, group in groups.items():  # warm-up: first calls allocate and fault pages in
            for mode in MODES:
                timed(mode, group)
        local = {(n, m): [] for n in groups for m in MODES}
        for _ in range(args.reps):
            for name, group in groups.items():
                for mode in MODES:
                    local[(name, mode)].append(timed(mode, group))
        wrong = 0.0
    except AssertionError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        wrong = 1.0
    if script.slowest([wrong], ctrl)[0]:  # any rank's
        dist.destroy_process_group()
        return EXIT_WRONG

    slowest = dict(zip(local, script.slowest(list(local.values()), ctrl)))
    med = {k: statistics.median(v) for k, v in slowest.items()}

    if rank == 0:
        print(f"all_reduce {args.mib:g} MiB float32 and a {args.matmul}x{args.matmul} float32 matmul, "
              f"{world} ranks, {args.threads} torch thread(s) per rank, {len(os.sched_getaffinity(0))} "
              f"usable CPUs; median of {args.reps} (slowest rank), ms\n")
        print("| backend |   comm | compute | sequential | overlapped | best possible |  saved | overlap helps |")
        print("|:--------|-------:|--------:|-----------:|-----------:|--------------:|-------:|:--------------|")
        summary = {}
        for name in groups:
            c, k, s, o = (med[(name, m)] * 1e3 for m in MODES)
            best = max(c, k)
            saved = s - o
            # "helps" only when the saving is more than noise: 5% of the sequential time.
            helps = saved > 0.05 * s
            summary[name] = {"comm_ms": c, "compute_ms": k, "sequential_ms": s, "overlapped_ms": o,
                             "best_possible_ms": best, "saved_ms": saved, "overlap_helps": helps}
            print(f"| {name:<7} | {c:6.1f} | {k:7.1f} | {s:10.1f} | {o:10.1f} | {best:13.1f} | "
                  f"{saved:6.1f} | {'yes' if helps else 'no':<13} |")
        spare = len(os.sched_getaffinity(0)) - world * args.threads
        print(f"\n{'no spare core' if spare <= 0 else f'{spare} spare core(s)'} for the communication "
              f"({world} ranks x {args.threads} thread(s) on {len(os.sched_getaffinity(0))} CPUs)")
        script.write_json(args.json, {"bench": "overlap", "config": vars(args), "world_size": world,
                                      "usable_cpus": len(os.sched_getaffinity(0)), "torch": torch.__version__,
                                      "median_ms": summary,
                                      "samples_s": {f"{n}/{m}": v for (n, m), v in slowest.items()}})
    return script.finish(ctrl)


if __name__ == "__main__":
    sys.exit(main())
