"""Which outputs the copy path writes with streaming stores (``shmcoll_copy_streaming`` of _ext/shmcoll_arch.h).

An ordinary store reads a line before it writes it, so a copy into memory that is not cached moves three bytes
of memory traffic per byte copied; a streaming (non-temporal) store writes the line without reading it and
without keeping it in the caches, two bytes per byte. That pays where the output would not stay in cache
anyway: where the node's outputs and inputs together outgrow its last-level cache. Below, it would send to
memory an output its reader finds in cache today. On the 2-core VM (32 MiB L3) an all_gather_into_tensor at 2
ranks streamed took 80 against 45 us at 1 MiB, 7.5-8.3 against 8.8-9.7 ms at 64 MiB (BENCHMARKS.md, "Threads
per rank"). The all-gathers' copy-out decides by it (``_ext/allgather.pxi``): their whole output is the
largest buffer a rank writes, read by no peer. An all-to-all's copy-out (``_ext/alltoall.pxi``) uses the same
threshold for what it receives; its inputs are as large as its outputs, so it streams a little later than the
cache alone would say (16 MiB at 2 ranks: 2.07-2.40 ms before, 1.50-1.91 streamed, BENCHMARKS.md).
"""
from __future__ import annotations

import os

from shmcoll.descriptors import BEYOND_ANY_MESSAGE

_CPUS = "/sys/devices/system/cpu"


def last_level_cache_bytes() -> int:
    """The size of the largest cache of the first CPU this process may use (sysfs), 0 where it says none."""
    cpu = min(os.sched_getaffinity(0))
    caches = os.path.join(_CPUS, f"cpu{cpu}", "cache")
    best_level, size = 0, 0
    try:
        names = os.listdir(caches)
    except OSError:
        return 0
    for name in names:
        if not name.startswith("index"):
            continue
        try:
            with open(os.path.join(caches, name, "level")) as f:
                level = int(f.read())
            with open(os.path.join(caches, name, "size")) as f:
                text = f.read().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            value = int(text.rstrip("KMG")) * scale
        except ValueError:
            continue
        if level > best_level:
            best_level, size = level, value
    return size


def least_output_bytes(local_size: int, cache_bytes: int | None = None) -> int:
    """The least output per rank (bytes) an all-gather writes with streaming stores: where the node's L ranks'
    outputs of n bytes and inputs of n / L outgrow the last-level cache, L n + n > cache, so n > cache / (L + 1);
    ``BEYOND_ANY_MESSAGE`` (never) where the cache's size is unknown."""
    cache = last_level_cache_bytes() if cache_bytes is None else cache_bytes
    return BEYOND_ANY_MESSAGE if cache <= 0 else cache // (local_size + 1) + 1
