#!/usr/bin/env python3
"""DDP training step time, shm against gloo in one job (the goal: shm >= 1.5x faster per step; BENCHMARKS.md,
"Goals of issue 4").

    .venv/bin/torchrun --nproc_per_node=2 bench/bench_ddp.py --json results/ddp-2ranks.json

Model: an MLP of --layers Linear(--width, --width) + ReLU (default 6 x 2048: 25.2M
parameters, 100 MB of float32 gradients per step), batch --batch per rank, MSE loss, SGD.
Two copies start from the same weights: one wrapped in DDP over the default group (shm),
one over ``new_group(backend="gloo")``; a third copy without DDP ("local": no communication at
all) gives the compute floor, so that step - local is what communication adds.  After --warmup
steps each (DDP rebuilds its buckets after the first), rounds alternate shm, gloo, local, shm,
gloo, local ... (--rounds of --steps steps each), so all see the same machine.  A step is zero_grad, forward, loss, backward (during which DDP
all-reduces the gradient buckets; backward returns once all are done), optimizer step.  Step
time = the slowest rank's; the table shows the median and spread over all timed steps.

Both copies get the same batches in the same order, so their losses must agree step by step:
the run fails (exit 3) if any differs by more than 1e-5 relative, and reports whether they are
bitwise equal.  Bookkeeping (barriers, gathering times) uses a third, gloo, group.  --threads
sets torch's threads per rank (default 1: 2 ranks on a 2-core machine leave no spare core).
Takes about 30 s at the defaults on a quiet 2-core machine.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from shmcoll_bench import script

EXIT_MISMATCH = 3
GOAL_SPEEDUP = 1.5


def mlp(width: int, layers: int) -> torch.nn.Module:
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks[:-1])  # no ReLU after the last layer


def batches(rank: int, count: int, batch: int, width: int) -> list:
    """Deterministic (input, target) per step and rank, made before timing starts."""
    out = []
    for step in range(count):
        g = torch.Generator().manual_seed(1000 * step + rank)
        out.append((torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)))
    return out


def train_step(model, optimizer, data) -> float:
    x, y = data
    optimizer.zero_grad(set_to_none=False)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def add_round_options(p: argparse.ArgumentParser, warmup: int, rounds: int, steps: int) -> None:
    """The options of ``alternating_rounds``, with the script's defaults."""
    p.add_argument("--warmup", type=int, default=warmup, help=f"untimed steps per backend (default {warmup})")
    p.add_argument("--rounds", type=int, default=rounds, help=f"alternating rounds per backend (default {rounds})")
    p.add_argument("--steps", type=int, default=steps, help=f"steps per round (default {steps})")


def alternating_rounds(models: dict, optimizers: dict, data: list, step_fn, warmup: int, rounds: int, steps: int,
                       ctrl) -> tuple[dict, dict]:
    """Train every model of ``models`` (name -> model) on the same ``data``: ``warmup`` untimed steps each,
    then ``rounds`` rounds in which each model in turn takes ``steps`` timed steps (shm, gloo, local, shm,
    ...), so all see the same machine. ``step_fn(model, optimizer, batch)`` returns the loss. Returns (the
    losses of every step, the slowest rank's time of every timed step), both by name; ``ctrl`` is the
    group of the bookkeeping collectives (never timed)."""
    losses = {name: [] for name in models}
    times = {name: [] for name in models}
    for name in models:
        for step in range(warmup):
            losses[name].append(step_fn(models[name], optimizers[name], data[step]))
    for r in range(rounds):
        for name in models:
            dist.barrier(group=ctrl)
            for i in range(steps):
                start = time.perf_counter()
                losses[name].append(step_fn(models[name], optimizers[name], data[warmup + r * steps + i]))
                times[name].append(time.perf_counter() - start)
    return losses, dict(zip(models, script.slowest([times[n] for n in models], ctrl)))


def print_step_times(step_s: dict) -> dict:
    """The table of step times (``alternating_rounds``' second result) by model, with what each takes beyond
    the "local" model's (no communication); returns the median step time by name."""
    med = {n: statistics.median(v) for n, v in step_s.items()}
    print("| backend | median step ms | min ms | max ms | median - local ms |")
    print("|:--------|---------------:|-------:|-------:|------------------:|")
    for n, v in step_s.items():
        print(f"| {n:<7} | {med[n] * 1e3:14.1f} | {min(v) * 1e3:6.1f} | {max(v) * 1e3:6.1f} | "
              f"{(med[n] - med['local']) * 1e3:17.1f} |")
    return med


def main() -> int:
    p = script.parser(__doc__)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    add_round_options(p, warmup=3, rounds=5, steps=4)
    p.add_argument("--bucket-mb", type=float, default=25, help="DDP bucket_cap_mb (DDP's default 25)")
    p.add_argument("--bucket-view", action="store_true",
                   help="DDP gradient_as_bucket_view=True (gradients live in the buckets: no copy in and out)")
    args = p.parse_args()
    job = script.start(args.threads)
    rank, world, ctrl = job.rank, job.world, job.ctrl

    torch.manual_seed(0)
    base = mlp(args.width, args.layers)
    params = sum(p.numel() for p in base.parameters())
    models = {name: DDP(copy.deepcopy(base), process_group=group, bucket_cap_mb=args.bucket_mb,
                        gradient_as_bucket_view=args.bucket_view)
              for name, group in job.groups.items()}
    models["local"] = copy.deepcopy(base)  # the same work with no communication
    optimizers = {name: torch.optim.SGD(model.parameters(), lr=1e-3) for name, model in models.items()}
    total_steps = args.warmup + args.rounds * args.steps
    data = batches(rank, total_steps, args.batch, args.width)

    losses, step_s = alternating_rounds(models, optimizers, data, train_step, args.warmup, args.rounds, args.steps,
                                        ctrl)
    # Whether any rank saw different losses.
    worst = max(abs(a - b) / max(abs(a), abs(b), 1e-30) for a, b in zip(losses["shm"], losses["gloo"]))
    worst_rel, differs = script.slowest([worst, float(losses["shm"] != losses["gloo"])], ctrl)

    code = EXIT_MISMATCH if worst_rel > 1e-5 else 0  # the same on every rank
    if rank == 0:
        print(f"DDP step, MLP {args.layers} x Linear({args.width}, {args.width}) = {params / 1e6:.1f}M "
              f"parameters ({params * 4 / 2**20:.0f} MiB of float32 gradients), batch {args.batch} per rank, "
              f"{world} ranks, {args.threads} torch thread(s) per rank, bucket {args.bucket_mb:g} MB, "
              f"{os.cpu_count()} CPUs")
        print(f"{len(step_s['shm'])} timed steps per backend in {args.rounds} alternating rounds; "
              f"step time = slowest rank\n")
        med = print_step_times(step_s)
        speedup = med["gloo"] / med["shm"]
        print(f"\ngloo/shm step time: {speedup:.2f}x (goal >= {GOAL_SPEEDUP}x: "
              f"{'met' if speedup >= GOAL_SPEEDUP else 'not met'})")
        print(f"losses: {'bitwise equal' if not differs else f'max relative difference {worst_rel:.2e}'} "
              f"over {len(losses['shm'])} steps (last {losses['shm'][-1]:.6f})")
        if code:
            print("error: shm and gloo trained to different losses", file=sys.stderr)
        script.write_json(args.json, {
            "bench": "ddp", "config": vars(args), "world_size": world, "parameters": params, "cpus": os.cpu_count(),
            "torch": torch.__version__, "step_s": step_s, "median_step_s": med, "speedup_gloo_over_shm": speedup,
            "goal": f"gloo/shm >= {GOAL_SPEEDUP}", "goal_met": speedup >= GOAL_SPEEDUP,
            "losses_bitwise_equal": not differs, "loss_max_rel_diff": worst_rel, "losses": losses})
    return script.finish(ctrl, code)


if __name__ == "__main__":
    sys.exit(main())
