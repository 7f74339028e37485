#!/usr/bin/env python3
"""What lanes (threads per rank) buy, inside one process: the arena of one rank.

    .venv/bin/python bench/bench_lanes.py [--max-lanes N] [--min-bytes 16K] [--max-bytes 64M] [--json PATH]

Where a machine has too few cores to give several ranks several threads each
(the 2-core development VM), what a fan-out over lanes costs and what it buys
can still be seen inside one process: an arena of one local rank with lanes
(``shmcoll.lanes``), running the same C schedules every collective runs (copy
into the slots, reduce, copy out; all_gather and broadcast copies) on 1 lane
(the arena's own steps, on this thread: what a message below
``SHMCOLL_THREAD_BYTES`` x 2 does) and on 2..N lanes, native threads joined in
C. Each point is the best of several calls of the message size given (per
rank); beside it, torch's ``copy_`` of the same bytes with as many threads. The
sizes from which 2 lanes beat 1 are what SHMCOLL_THREAD_BYTES's default comes
from (README). The sweeps with several ranks are ``bench/threads.sh``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import timedelta

import torch

from shmcoll import _segment, arena as arena_module, kernel_library, kernels
from shmcoll import lanes as L
from shmcoll._env import parse_bytes, read_settings
from shmcoll.algorithms import allgather, allreduce, broadcast, reduce_scatter
from shmcoll.waits import Budgets

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


def one_rank_arena(chunk_bytes: int, p2p_bytes: int, lanes: int):
    layout = arena_module.layout(1, chunk_bytes, p2p_bytes, lanes)
    segment = _segment.create_unnamed(read_settings().shm_dir, layout.total)
    segment.release_fd()
    arena_module._init_header(segment, 1, chunk_bytes, p2p_bytes, lanes)
    # The inline waits of a rank alone on its cores: a short spin (waits.policy).
    arena = arena_module.Arena(segment, 0, 1, chunk_bytes, p2p_bytes, timedelta(seconds=60),
                               Budgets(20_000, 500_000), [0], lanes)
    arena._record_pid()
    return segment, arena


def best_of(fn, repeats: int, budget_s: float = 0.2) -> float:
    fn()
    best, spent = float("inf"), 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    return best


def calls(arena, lanes, n: int, nbytes: int, data, out, entry):
    """One call of each kind on ``n`` lanes (1: the arena's own steps on this thread)."""
    a, o, count = data.data_ptr(), out.data_ptr(), nbytes // 4
    if n == 1:
        return {
            "all_reduce": lambda: allreduce.reduce_scatter_allgather(arena, a, count, 4, entry, kernels.SUM, 1.0, 1),
            "reduce_scatter": lambda: reduce_scatter.reduce_scatter(arena, a, count, 4, entry, kernels.SUM, 1.0, o, 2,
                                                                    block_stride=count),
            "all_gather": lambda: allgather.allgather(arena, a, nbytes, (o, nbytes), 3),
            "broadcast": lambda: broadcast.broadcast(arena, a, nbytes, 0, 4),
        }
    return {
        "all_reduce": lambda: lanes.run(L.CHUNKED, n, 1, count, 4, a, kernel=entry, op=kernels.SUM),
        "reduce_scatter": lambda: lanes.run(L.REDUCE_SCATTER, n, 2, count, 4, a, out=o, block_stride=count,
                                            kernel=entry, op=kernels.SUM),
        "all_gather": lambda: lanes.run(L.ALLGATHER, n, 3, nbytes, 1, a, out=o, out_stride=nbytes),
        "broadcast": lambda: lanes.run(L.BROADCAST, n, 4, nbytes, 1, a, root=0),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-lanes", type=int, default=min(len(os.sched_getaffinity(0)), arena_module.MAX_LANES))
    p.add_argument("--min-bytes", default="16K", help="smallest message (per rank)")
    p.add_argument("--max-bytes", default="64M", help="largest message (per rank)")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    settings = read_settings()
    sizes, size = [], parse_bytes(args.min_bytes)
    while size <= parse_bytes(args.max_bytes):
        sizes.append(size)
        size *= 4
    data, out = torch.ones(sizes[-1] // 4), torch.empty(sizes[-1] // 4)
    entry = kernel_library.entry_point("float32")
    segment, arena = one_rank_arena(settings.chunk_bytes, settings.p2p_bytes, max(2, args.max_lanes))
    lanes = L.Lanes(arena, 4096)
    rows = []
    for nbytes in sizes:
        for n in range(1, args.max_lanes + 1):
            times = {kind: best_of(call, args.repeats)
                     for kind, call in calls(arena, lanes, n, nbytes, data, out, entry).items()}
            torch.set_num_threads(n)
            src, dst = data[:nbytes // 4], out[:nbytes // 4]
            times["copy_"] = best_of(lambda: dst.copy_(src), args.repeats)
            rows.append({"bytes": nbytes, "lanes": n, "us": {k: v * 1e6 for k, v in times.items()},
                         "gb_s": {k: nbytes / v / 1e9 for k, v in times.items()}})
    lanes.close()
    arena.close()
    del segment
    print(f"One rank, float32, {settings.chunk_bytes // 1024} KiB chunks ({arena_module.lane_bytes(settings.chunk_bytes) // 1024} "
          f"KiB lane slots), {len(os.sched_getaffinity(0))} usable CPUs, {platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}; us per call (best of up to {args.repeats}), and speed-up over 1 lane\n")
    names = [*KINDS, "copy_"]
    print("| bytes | lanes | " + " | ".join(names) + " |")
    print("|---:|---:|" + "---:|" * len(names))
    first = {}
    for row in rows:
        if row["lanes"] == 1:
            first = row
        print(f"| {_size(row['bytes'])} | {row['lanes']} | " + " | ".join(
            f"{row['us'][k]:.1f} ({first['us'][k] / row['us'][k]:.2f}x)" for k in names) + " |")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"bench": "lanes", "config": vars(args), "chunk_bytes": settings.chunk_bytes,
                       "cpus": len(os.sched_getaffinity(0)), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


if __name__ == "__main__":
    raise SystemExit(main())
