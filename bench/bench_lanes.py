#!/usr/bin/env python3
"""Per-thread scaling of the lane data path, in one process (issue 14).

    .venv/bin/python bench/bench_lanes.py [--mib 64] [--max-threads N] [--json PATH]

Where a machine has too few cores to give several ranks several threads each
(the 2-core development VM), the scaling of the lanes can still be seen
inside one process: an arena of one local rank, and the same C schedules that
every collective runs (copy into the slots, reduce, copy out; all_gather and
broadcast copies), split over 1, 2, ... lanes by ``shmcoll.lanes`` exactly as
a real group splits them. Each row is the best of several calls; beside it,
torch's ``copy_`` of the same buffer with as many threads (the copy ceiling).
The end-to-end sweeps with several ranks are ``bench/threads.sh``.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch

from shmcoll import _segment, arena as arena_module, kernel_library, kernels
from shmcoll._env import read_settings
from shmcoll.algorithms import allgather, allreduce, broadcast
from shmcoll.lanes import Lanes
from shmcoll.waits import SLEEP_AT_ONCE


def one_rank_arena(chunk_bytes: int, p2p_bytes: int):
    layout = arena_module.layout(1, chunk_bytes, p2p_bytes)
    segment = _segment.create_unnamed(read_settings().shm_dir, layout.total)
    segment.release_fd()
    arena_module._init_header(segment, 1, chunk_bytes)
    arena = arena_module.Arena(segment, 0, 1, chunk_bytes, p2p_bytes, timedelta(seconds=60), SLEEP_AT_ONCE, [0])
    arena._record_pid()
    return segment, arena


def best_of(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=64, help="message size (MiB of float32)")
    p.add_argument("--max-threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    settings = read_settings()
    count = args.mib * 2**20 // 4
    data = torch.ones(count)
    out = torch.empty(count)
    entry = kernel_library.entry_point("float32")
    rows = []
    for threads in range(1, args.max_threads + 1):
        segment, arena = one_rank_arena(settings.chunk_bytes, settings.p2p_bytes)
        lanes = Lanes(arena, threads, settings.thread_bytes, "bench")
        a, o = data.data_ptr(), out.data_ptr()
        nbytes = count * 4
        times = {
            "all_reduce": best_of(lambda: lanes.run(1, count, 4, lambda s, lo, hi: allreduce.reduce_scatter_allgather(
                s, a + 4 * lo, hi - lo, 4, entry, kernels.SUM, 1.0, 1)), args.repeats),
            "all_gather": best_of(lambda: lanes.run(2, nbytes, 1, lambda s, lo, hi: allgather.allgather_strided(
                s, a + lo, hi - lo, o + lo, nbytes, 2)), args.repeats),
            "broadcast": best_of(lambda: lanes.run(3, nbytes, 1, lambda s, lo, hi: broadcast.broadcast(
                s, a + lo, hi - lo, 0, 3)), args.repeats),
        }
        lanes.close()
        arena.close()
        torch.set_num_threads(threads)
        times["copy_ ceiling"] = best_of(lambda: out.copy_(data), args.repeats)
        row = {"threads": threads, **{k: nbytes / v / 1e9 for k, v in times.items()}}
        rows.append(row)
        del segment
    print(f"One rank, {args.mib} MiB float32, {settings.chunk_bytes // 1024} KiB chunks, "
          f"{len(os.sched_getaffinity(0))} usable CPUs, torch {torch.__version__}; GB/s of the message per call, "
          f"best of {args.repeats}\n")
    names = ["all_reduce", "all_gather", "broadcast", "copy_ ceiling"]
    print("| threads | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for row in rows:
        print(f"| {row['threads']} | " + " | ".join(
            f"{row[n]:.2f} ({row[n] / rows[0][n]:.2f}x)" for n in names) + " |")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"bench": "lanes", "config": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
