"""Every data-movement collective with every dtype a descriptor names, on any placement, against local references.

broadcast (every root), all_gather (list and tensor), gather and scatter (first and
last root), all_to_all (list and single), at a few sizes, over each dtype of
``kernel_abi.DTYPE_TABLE`` that torch can make: across nodes Gloo carries them, and
Gloo's own collectives refuse some of them (int16, uint16-64, float8) unless given
bytes.
"""
from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

from shmcoll import kernel_abi
from tests.scenarios import _equal

DTYPES = [getattr(torch, d.name) for d in kernel_abi.DTYPE_TABLE
          if hasattr(torch, d.name) and not d.name.startswith(("qint", "quint"))]


def data(case: str, rank: int, dtype, count: int) -> torch.Tensor:
    """Random bytes of ``count`` elements of ``dtype``, from (case, rank): bit patterns, never arithmetic."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    g = torch.Generator().manual_seed(zlib.crc32(f"{case}/{rank}".encode()))
    raw = torch.randint(0, 256, (count * itemsize,), generator=g, dtype=torch.uint8)
    if dtype == torch.bool:
        raw &= 1
    return raw.view(dtype)


def _same(actual, expected, what):
    """Bitwise equality (NaN patterns included)."""
    _equal(actual.view(-1).view(torch.uint8), expected.view(-1).view(torch.uint8), what)


def every_dtype_moved(cases, big: str = "3001"):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in DTYPES:
        name = str(dtype).removeprefix("torch.")
        for count in (1, 7, int(big)):
            for root in range(world):
                case = f"broadcast/{name}/n={count}/root={root}"
                cases.run(case, _broadcast, case, rank, dtype, count, root)
            for root in sorted({0, world - 1}):
                case = f"gather/{name}/n={count}/root={root}"
                cases.run(case, _gather, case, rank, world, dtype, count, root)
                case = f"scatter/{name}/n={count}/root={root}"
                cases.run(case, _scatter, case, rank, world, dtype, count, root)
            case = f"all_gather/{name}/n={count}"
            cases.run(case, _all_gather, case, rank, world, dtype, count)
            case = f"all_to_all/{name}/n={count}"
            cases.run(case, _all_to_all, case, rank, world, dtype, count)


def _broadcast(case, rank, dtype, count, root):
    tensor = data(case, root, dtype, count) if rank == root else _empty(dtype, count)
    dist.broadcast(tensor, src=root)
    _same(tensor, data(case, root, dtype, count), "broadcast")


def _empty(dtype, count):
    return torch.zeros(count * dtype.itemsize, dtype=torch.uint8).view(dtype)


def _all_gather(case, rank, world, dtype, count):
    everyone = [data(case, r, dtype, count) for r in range(world)]
    outs = [_empty(dtype, count) for _ in range(world)]
    dist.all_gather(outs, everyone[rank])
    for r in range(world):
        _same(outs[r], everyone[r], f"all_gather slot {r}")
    out = _empty(dtype, count * world)
    dist.all_gather_into_tensor(out, everyone[rank])
    _same(out, torch.cat([t.view(torch.uint8) for t in everyone]).view(dtype), "all_gather_into_tensor")


def _gather(case, rank, world, dtype, count, root):
    outs = [_empty(dtype, count) for _ in range(world)] if rank == root else None
    dist.gather(data(case, rank, dtype, count), outs, dst=root)
    for r in range(world if rank == root else 0):
        _same(outs[r], data(case, r, dtype, count), f"gather slot {r}")


def _scatter(case, rank, world, dtype, count, root):
    out = _empty(dtype, count)
    dist.scatter(out, [data(f"{case}/{r}", root, dtype, count) for r in range(world)] if rank == root else None,
                 src=root)
    _same(out, data(f"{case}/{rank}", root, dtype, count), "scatter")


def _all_to_all(case, rank, world, dtype, count):
    def block(src, dst):
        return data(f"{case}/{src}->{dst}", src, dtype, count)

    outs = [_empty(dtype, count) for _ in range(world)]
    dist.all_to_all(outs, [block(rank, j) for j in range(world)])
    for r in range(world):
        _same(outs[r], block(r, rank), f"all_to_all from {r}")
    out = _empty(dtype, count * world)
    dist.all_to_all_single(out, torch.cat([block(rank, j).view(torch.uint8) for j in range(world)]).view(dtype))
    _same(out, torch.cat([block(r, rank).view(torch.uint8) for r in range(world)]).view(dtype), "all_to_all_single")
