#!/usr/bin/env python3
"""Start-up cost: init_process_group and the first all_reduce of each dtype, shm vs gloo.

    .venv/bin/python bench/bench_startup.py --json results/startup-2ranks.json
    .venv/bin/python bench/bench_startup.py --nproc 4 --trials 5 --cold-trials 2

The goal: shm within 2x of gloo with a warm kernel cache (docs/benchmark-log.md, "Goals of issue 4").

Every trial is a fresh ``torchrun --standalone --nproc_per_node N`` job of this file, so
nothing (imports, Numba kernels in memory, the arena) carries over.  In each rank, after
``import torch``, it times ``init_process_group(backend)`` and then the first all_reduce of
float32, bfloat16 and int64 (--numel elements each, checked); "total" is their sum, the
slowest rank's per trial, median over trials.  Trials alternate shm, gloo, shm, gloo ...

- shm warm: the kernel library is built first (``python -m shmcoll warm``), as bench/run.sh
  and tests/run.sh leave it, so the ranks load it and never import Numba.
- shm cold: NUMBA_CACHE_DIR points at a new empty directory for each trial, so every kernel
  is compiled and linked (what the first job on a fresh install pays; both ranks build at once).
- gloo: no cache involved.

One untimed launch comes first so that the files (torch, shmcoll) are in the page
cache.  "launch s" is the whole torchrun job's wall time seen from here (Python start-up,
import torch, rendezvous, exit), for context; the goal is about "total".  Takes about a
minute on a 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

GOAL_RATIO = 2.0
DTYPES = ("float32", "bfloat16", "int64")


def worker(args) -> None:
    """One rank of one trial: times init and the first all_reduces, writes rank<r>.json."""
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    start = time.perf_counter()
    dist.init_process_group(args.backend)
    timings = {"init_s": time.perf_counter() - start}
    world = dist.get_world_size()
    for name in DTYPES:
        t = torch.ones(args.numel, dtype=getattr(torch, name))
        start = time.perf_counter()
        dist.all_reduce(t)
        timings[f"first_{name}_s"] = time.perf_counter() - start
        if not bool((t == world).all()):
            raise SystemExit(f"rank {rank}: first {name} all_reduce is wrong: {t[:4].tolist()}")
    timings["total_s"] = sum(timings.values())
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(timings, f)
    dist.destroy_process_group()


def launch(args, backend: str, cache_dir: str | None) -> dict:
    """One torchrun job; the slowest rank's timings plus the job's wall time."""
    with tempfile.TemporaryDirectory(prefix="shmcoll-startup-") as out:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if cache_dir is not None:
            env["NUMBA_CACHE_DIR"] = cache_dir
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", str(args.nproc), os.path.abspath(__file__),
                   "--worker", "--backend", backend, "--out", out, "--numel", str(args.numel)]
        start = time.perf_counter()
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            sys.stderr.write(done.stdout)
            raise SystemExit(f"error: the {backend} trial failed (exit status {done.returncode})")
        ranks = []
        for r in range(args.nproc):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    slowest = {key: max(rank[key] for rank in ranks) for key in ranks[0]}
    slowest["launch_s"] = wall
    return slowest


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--trials", type=int, default=9, help="warm trials per backend (default 9: rank skew makes single trials noisy)")
    p.add_argument("--cold-trials", type=int, default=1, help="shm trials with an empty kernel cache (default 1)")
    p.add_argument("--numel", type=int, default=1024, help="elements of each first all_reduce (default 1024)")
    p.add_argument("--json", metavar="PATH", help="write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0

    subprocess.run([sys.executable, "-m", "shmcoll", "warm"], check=True, stdout=subprocess.DEVNULL)
    launch(args, "shm", None)  # untimed: fills the page cache
    trials = {"shm warm": [], "gloo": [], "shm cold": []}
    for _ in range(args.trials):
        trials["shm warm"].append(launch(args, "shm", None))
        trials["gloo"].append(launch(args, "gloo", None))
    for _ in range(args.cold_trials):
        with tempfile.TemporaryDirectory(prefix="shmcoll-cold-numba-") as empty:
            trials["shm cold"].append(launch(args, "shm", empty))
    trials = {k: v for k, v in trials.items() if v}

    keys = ["init_s"] + [f"first_{d}_s" for d in DTYPES] + ["total_s", "launch_s"]
    med = {name: {k: statistics.median(t[k] for t in runs) for k in keys} for name, runs in trials.items()}
    print(f"init_process_group + first all_reduce ({args.numel} elements) per dtype, {args.nproc} ranks, "
          f"fresh torchrun job per trial; slowest rank, median of {args.trials} warm / {args.cold_trials} "
          f"cold trial(s); ms ({os.cpu_count()} CPUs)\n")
    print("| backend  | trials |   init | float32 | bfloat16 |  int64 |  total | launch s |")
    print("|:---------|-------:|-------:|--------:|---------:|-------:|-------:|---------:|")
    for name, m in med.items():
        print(f"| {name:<8} | {len(trials[name]):6d} | {m['init_s'] * 1e3:6.0f} | "
              f"{m['first_float32_s'] * 1e3:7.1f} | {m['first_bfloat16_s'] * 1e3:8.1f} | "
              f"{m['first_int64_s'] * 1e3:6.1f} | {m['total_s'] * 1e3:6.0f} | {m['launch_s']:8.1f} |")
    ratio = med["shm warm"]["total_s"] / med["gloo"]["total_s"]
    print(f"\nshm/gloo total, warm cache: {ratio:.2f}x (goal <= {GOAL_RATIO:g}x: "
          f"{'met' if ratio <= GOAL_RATIO else 'not met'})")
    cold_ratio = None
    if "shm cold" in med:
        cold_ratio = med["shm cold"]["total_s"] / med["gloo"]["total_s"]
        print(f"shm/gloo total, cold cache: {cold_ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "startup", "config": {k: v for k, v in vars(args).items()
                                                      if k not in ("worker", "backend", "out")},
                       "cpus": os.cpu_count(), "median": med, "trials": trials,
                       "ratio_shm_over_gloo_warm": ratio, "ratio_shm_over_gloo_cold": cold_ratio,
                       "goal": f"shm/gloo warm <= {GOAL_RATIO:g}", "goal_met": ratio <= GOAL_RATIO}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
