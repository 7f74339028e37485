"""What the three examples (ddp.py, tp_inference.py, fsdp2.py) share.

The common options (--backend, --threads, --seed, --json), the thread count per
rank, the training loop's timing and loss log (``train``), the timing summary
taken over all ranks, and the JSON file. Each example
still calls ``dist.init_process_group`` and ``dist.destroy_process_group``
itself, so it reads like the script a user would write; this module only holds
what would otherwise be copied three times. The examples import it as
``_common``: torchrun puts the script's folder (examples/) on sys.path.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser with the options every example takes; ``doc`` is the example's docstring."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="shm", help="torch.distributed backend: shm or gloo (default shm)")
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads per rank (default: usable cores // local ranks, at least 1)")
    p.add_argument("--seed", type=int, default=0, help="same seed, same data, weights and losses on any backend")
    p.add_argument("--json", metavar="PATH", help="rank 0 writes the results here")
    return p


def training_parser(doc: str, steps: int, warmup: int, optimizer: str) -> argparse.ArgumentParser:
    """``parser`` with the options of a training example (``train``): its steps, warm-up steps, learning rate and
    how often it prints the loss."""
    p = parser(doc)
    p.add_argument("--steps", type=int, default=steps, help=f"timed steps (default {steps})")
    p.add_argument("--warmup", type=int, default=warmup, help=f"untimed steps before them (default {warmup})")
    p.add_argument("--lr", type=float, default=1e-3, help=f"{optimizer} learning rate (default 1e-3)")
    p.add_argument("--log-every", type=int, default=5, help="print the loss every k steps (default 5)")
    return p


def default_threads() -> int:
    """Usable cores shared out between the ranks of this machine.

    More threads than cores in total (say 2 ranks x 2 threads on 2 cores) makes
    the ranks preempt each other in the middle of a collective, where every
    rank waits for the slowest one; the step time then measures the scheduler.
    """
    cores = len(os.sched_getaffinity(0))
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, cores // local_ranks)


def set_threads(requested: int | None) -> int:
    threads = requested if requested else default_threads()
    torch.set_num_threads(threads)
    return threads


def banner(example: str, args: argparse.Namespace, threads: int, details: str) -> None:
    """Rank 0 prints what runs, so that the output of two runs can be told apart."""
    if dist.get_rank() == 0:
        print(f"{example}: backend={args.backend} world={dist.get_world_size()} threads/rank={threads} "
              f"torch={torch.__version__} | {details}", flush=True)


def mean_over_ranks(values: list[float]) -> list[float]:
    """The mean over ranks of each value (one all_reduce; SUM, since Gloo has no AVG)."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return (t / dist.get_world_size()).tolist()


def slowest_rank(values: list[float]) -> list[float]:
    """Each value's maximum over ranks: a step lasts until its slowest rank is done."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def step_summary(step_seconds: list[float]) -> dict:
    """Median step time (of the slowest rank per step) in ms and the steps per second it implies."""
    median_s = statistics.median(slowest_rank(step_seconds))
    return {"median_step_ms": median_s * 1e3, "steps_per_s": 1.0 / median_s}


def train(example: str, args, threads: int, params: int, next_batch, train_step) -> None:
    """``args.warmup`` untimed steps, then ``args.steps`` timed ones: each takes ``next_batch()`` (not timed) and
    times ``train_step(batch)``, which returns the step's loss; then the summary (``report_training``)."""
    losses, step_seconds = [], []
    total = args.warmup + args.steps
    for step in range(total):
        batch = next_batch()
        start = time.perf_counter()
        loss = train_step(batch)
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            step_seconds.append(elapsed)
        record_step(losses, step, loss, elapsed, args, total)
    report_training(example, args, threads, params, step_seconds, losses)


def record_step(losses: list[float], step: int, loss: torch.Tensor, elapsed: float, args, total: int) -> None:
    """Append the step's loss, averaged over ranks (outside the timed part), and print it on rank 0."""
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    losses.append(mean_loss.item() / dist.get_world_size())
    if dist.get_rank() == 0 and (step % args.log_every == 0 or step == total - 1):
        print(f"  step {step:4d}  loss {losses[-1]:.8f}  {elapsed * 1e3:8.2f} ms"
              f"{'  (warm-up)' if step < args.warmup else ''}", flush=True)


def report_training(example: str, args, threads: int, params: int, step_seconds: list[float],
                    losses: list[float]) -> None:
    """Rank 0 prints the median step time, steps/s and final loss, and writes them to --json."""
    world = dist.get_world_size()
    summary = step_summary(step_seconds)
    if dist.get_rank() == 0:
        print(f"{example} {args.backend:>4} world={world}: median step {summary['median_step_ms']:.2f} ms, "
              f"{summary['steps_per_s']:.1f} steps/s, final loss {losses[-1]:.8f}", flush=True)
    write_json(args.json, {
        "example": example, "backend": args.backend, "world_size": world, "threads": threads, "params": params,
        "args": vars(args), **summary, "final_loss": losses[-1], "losses": losses,
    })


def write_json(path: str | None, results: dict) -> None:
    if path and dist.get_rank() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
