"""A rank whose kernel library was built before it started (``python -m shmcoll warm``): its group and its
reductions of every dtype run the compiled library, and Numba is never imported."""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist

NO_NUMBA_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int8, torch.bool)


def no_numba_after_init(cases):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in NO_NUMBA_DTYPES:
        t = torch.ones(1000, dtype=dtype)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if dtype == torch.bool else dist.ReduceOp.SUM)
        expected = torch.ones(1000, dtype=dtype) * (1 if dtype == torch.bool else world)
        cases.check(f"no_numba/{dtype}", torch.equal(t, expected), f"rank {rank}: {t[:4].tolist()}")
    loaded = sorted(name for name in sys.modules if name == "numba" or name.startswith(("numba.", "llvmlite")))
    cases.check("no_numba/modules", not loaded, f"rank {rank} imported {loaded[:5]}")


def no_numba_after_init_cases() -> int:
    """How many checks ``no_numba_after_init`` records on each rank: a reduction per dtype, then the modules."""
    return len(NO_NUMBA_DTYPES) + 1
