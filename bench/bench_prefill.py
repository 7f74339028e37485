#!/usr/bin/env python3
"""Tensor-parallel prefill layers, the all-reduce between matrix products: shm against DeepSpeed's CPU
all-reduce (and Gloo) in one job, where the collective's threads find the cores busy with the computation
before it, as in CPU inference.

    .venv/bin/torchrun --nproc_per_node=2 bench/bench_prefill.py --threads 1 --tokens 16,128
    OMP_NUM_THREADS=8 torchrun --nproc_per_node=2 bench/bench_prefill.py --threads 8 --json results/prefill.json

A layer is the row-parallel half of a Megatron MLP on --tokens tokens of --hidden bfloat16 (each rank holds
1/world of the inner dimension, --ffn, default 4 x hidden): ``partial = a @ W_down_shard.T`` on torch's
threads, then the all-reduce of ``partial`` ([tokens, hidden] bfloat16, tokens x hidden x 2 bytes), then the
residual add. ``bench/peer_deepspeed.py`` times the all-reduce alone in a tight loop; here the computation
before each call leaves a backend's threads asleep, or the cores busy, as a layer does: shm's lanes are threads
of its own (asleep between collectives), DeepSpeed's are torch's OpenMP team, which the product just used.

Per --tokens, the first layer of each backend is checked against every other's (bitwise equal reported, a
relative difference beyond bfloat16 rounding fails, exit 3), then --rounds rounds of --layers layers, the
backends taking turns to go first; per backend the median over rounds of the slowest rank's time per layer,
and of the all-reduce alone within it; "none" runs the layer without the all-reduce (the computation's floor).
DeepSpeed is timed where it is installed (``pip install -e './bench[peers]'``; bench/peer_deepspeed.py says
what it needs), else left out with a note.
"""
from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from shmcoll_bench import script, sweep

EXIT_MISMATCH = 3


def parse_args(argv=None):
    p = script.parser(__doc__)
    p.add_argument("--tokens", default="16,64,256,1024", help="tokens per layer, comma-separated (default "
                   "16,64,256,1024: all-reduces of 128 KiB-8 MiB at --hidden 4096)")
    p.add_argument("--hidden", type=int, default=4096, help="hidden size (default 4096)")
    p.add_argument("--ffn", type=int, default=None, help="inner size of the MLP (default 4 x hidden)")
    p.add_argument("--layers", type=int, default=16, help="timed layers per round (default 16)")
    p.add_argument("--rounds", type=int, default=5, help="rounds per backend (default 5)")
    p.add_argument("--no-gloo", dest="gloo", action="store_false", help="leave Gloo out")
    return p.parse_args(argv)


def deepspeed_caller(ctrl):
    """DeepSpeed's ``inference_all_reduce`` set up beside the shm default group, or (None, why not)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    if importlib.util.find_spec("deepspeed") is None:
        return None, "DeepSpeed is not installed (pip install -e './bench[peers]')"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from peer_deepspeed import DeepSpeedAllReduce, not_applicable

    why = not_applicable()
    if why:
        return None, why
    peer = DeepSpeedAllReduce(sweep.Ctrl(ctrl))
    why = peer.unusable(torch.bfloat16)
    return (None, why) if why else (peer.call, None)


def main(argv=None) -> int:
    args = parse_args(argv)
    job = script.start(args.threads)
    rank, world = job.rank, job.world
    ffn = args.ffn or 4 * args.hidden
    if ffn % world:
        raise SystemExit(f"--ffn {ffn} is not divisible by the {world} ranks")
    gen = torch.Generator().manual_seed(1234 + rank)
    weight = (torch.randn(args.hidden, ffn // world, generator=gen) / ffn ** 0.5).to(torch.bfloat16)
    calls = {"shm": lambda t: dist.all_reduce(t)}
    if args.gloo:
        calls["gloo"] = lambda t: dist.all_reduce(t, group=job.groups["gloo"])
    ds_call, why = deepspeed_caller(job.ctrl)
    notes = [] if ds_call else [f"deepspeed left out: {why}"]
    if ds_call:
        calls["deepspeed"] = ds_call
    calls["none"] = None
    labels = list(calls)
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        inner = (torch.randn(tokens, ffn // world, generator=gen) * 0.5).to(torch.bfloat16)
        x = torch.zeros(tokens, args.hidden, dtype=torch.bfloat16)

        def layer(call, timing: list | None = None) -> torch.Tensor:
            partial = inner @ weight.T
            if call is not None:
                start = time.perf_counter()
                call(partial)
                if timing is not None:
                    timing.append(time.perf_counter() - start)
            return x + partial

        first = {lb: layer(calls[lb]) for lb in labels if calls[lb] is not None}
        reference = first["shm"].float()
        agree = {}
        for lb, out in first.items():
            err = float((out.float() - reference).abs().max() / reference.abs().max().clamp_min(1e-30))
            agree[lb] = torch.equal(out, first["shm"])
            if err > 2 ** -6:
                print(f"MISMATCH (rank {rank}) {lb} at {tokens} tokens: relative error {err:.3g}", file=sys.stderr)
                return script.finish(job.ctrl, EXIT_MISMATCH)
        per_layer = {lb: [] for lb in labels}
        in_call = {lb: [] for lb in labels}
        for r in range(args.rounds):
            turn = r % len(labels)
            for lb in labels[turn:] + labels[:turn]:
                for _ in range(2):  # untimed: the backend's threads and buffers as the layers leave them
                    layer(calls[lb])
                timing = []
                dist.barrier(group=job.ctrl)
                start = time.perf_counter()
                for _ in range(args.layers):
                    layer(calls[lb], timing)
                per_layer[lb].append((time.perf_counter() - start) / args.layers)
                in_call[lb].append(sum(timing) / args.layers)
        flat = script.slowest([v for lb in labels for v in per_layer[lb] + in_call[lb]], job.ctrl)
        n = args.rounds
        row = {"tokens": tokens, "bytes": tokens * args.hidden * 2, "results": {}}
        for i, lb in enumerate(labels):
            mine = flat[2 * n * i:2 * n * (i + 1)]
            row["results"][lb] = {"layer_us": statistics.median(mine[:n]) * 1e6,
                                  "all_reduce_us": statistics.median(mine[n:]) * 1e6 if calls[lb] else 0.0,
                                  "bitwise_equal_to_shm": agree.get(lb)}
        rows.append(row)
    if rank == 0:
        print(f"# prefill layers: {world} ranks x {args.threads} threads, hidden {args.hidden}, ffn {ffn}, "
              f"bfloat16, torch {torch.__version__}; medians of {args.rounds} rounds of {args.layers} layers, "
              "the slowest rank's; us per layer (the all-reduce's part in brackets)")
        print("\n| tokens | all-reduce bytes | " + " | ".join(labels) + " |")
        print("|---:|---:|" + "---:|" * len(labels))
        for row in rows:
            cells = [f"{row['results'][lb]['layer_us']:.1f}" + (f" ({row['results'][lb]['all_reduce_us']:.1f})"
                                                                  if calls[lb] else "") for lb in labels]
            print(f"| {row['tokens']} | {row['bytes']} | " + " | ".join(cells) + " |")
        for row in rows:
            unequal = [lb for lb, res in row["results"].items() if res["bitwise_equal_to_shm"] is False]
            if unequal:
                notes.append(f"{row['tokens']} tokens: {', '.join(unequal)} not bitwise equal to shm "
                             "(within bfloat16 rounding)")
        for note in notes:
            print(f"- {note}")
        script.write_json(args.json, {"config": {**vars(args), "ffn": ffn, "world": world,
                                                 "torch": torch.__version__}, "rows": rows, "notes": notes})
    return script.finish(job.ctrl)


if __name__ == "__main__":
    sys.exit(main())
