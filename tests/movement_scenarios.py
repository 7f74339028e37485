"""The collectives that move data without reducing it, against local references.

``every_dtype_moved``: broadcast (every root), all_gather (list and tensor),
gather and scatter (first and last root), all_to_all (list and single), at a few
sizes, over each dtype of ``kernel_abi.DTYPE_TABLE`` that torch can make: across
nodes Gloo carries them, and Gloo's own collectives refuse some of them (int16,
uint16-64, float8) unless given bytes.

``data_movement``: broadcast (every root), all_gather (list and tensor) and the
barrier at every size of ``element_counts``, strided tensors too; its checks
serve tests/multinode.py and the single-copy span edges as well.
"""
from __future__ import annotations

import os
import zlib

import torch
import torch.distributed as dist

from shmcoll import kernel_abi
from tests.references import assert_equal, element_counts, make_data

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
    assert_equal(actual.view(-1).view(torch.uint8), expected.view(-1).view(torch.uint8), what)


def every_dtype_moved(cases, big: str = "3001"):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in DTYPES:
        name = str(dtype).removeprefix("torch.")
        for count in _moved_sizes(big):
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


def _moved_sizes(big: str):
    return (1, 7, int(big))


def every_dtype_moved_cases(world: int, big: str = "3001") -> int:
    """How many cases ``every_dtype_moved`` runs on each rank: per dtype and size, a broadcast per root, a
    gather and a scatter per end root, an all_gather and an all_to_all."""
    per_size = world + 2 * len({0, world - 1}) + 2
    return len(DTYPES) * len(_moved_sizes(big)) * per_size


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


DATA_MOVEMENT_DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64, torch.uint8)


def data_movement(cases, big: str = "300001"):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in DATA_MOVEMENT_DTYPES:
        for count in element_counts(world, int(big)):
            for root in range(world):
                case = f"broadcast/{str(dtype)[6:]}/n={count}/root={root}"
                cases.run(case, check_broadcast, case, rank, root, dtype, count)
            case = f"all_gather/{str(dtype)[6:]}/n={count}"
            cases.run(case, check_all_gather, case, rank, world, dtype, count)
            case = f"all_gather_into_tensor/{str(dtype)[6:]}/n={count}"
            cases.run(case, check_all_gather_into_tensor, case, rank, world, dtype, count)
    cases.run_each(STRIDED_AND_BARRIER, rank, world)


def data_movement_cases(world: int, big: str = "300001") -> int:
    """How many cases ``data_movement`` runs on each rank: per dtype and size, a broadcast per root and both
    all_gathers; then ``STRIDED_AND_BARRIER``."""
    return len(DATA_MOVEMENT_DTYPES) * len(element_counts(world, int(big))) * (world + 2) + len(STRIDED_AND_BARRIER)


def check_broadcast(case, rank, root, dtype, count):
    """Broadcast ``root``'s input for ``case`` and compare with it on every rank."""
    expected = make_data(case, root, dtype, count)
    t = expected.clone() if rank == root else torch.zeros(count, dtype=dtype)
    dist.broadcast(t, src=root)
    assert_equal(t, expected, "broadcast")


def check_all_gather(case, rank, world, dtype, count):
    """Gather every rank's input for ``case`` into a list of tensors, each compared with that rank's input."""
    outs = [torch.zeros(count, dtype=dtype) for _ in range(world)]
    dist.all_gather(outs, make_data(case, rank, dtype, count))
    for r in range(world):
        assert_equal(outs[r], make_data(case, r, dtype, count), f"all_gather slot {r}")


def check_all_gather_into_tensor(case, rank, world, dtype, count):
    """Gather every rank's input for ``case`` into one tensor and compare with their concatenation."""
    out = torch.zeros(world * count, dtype=dtype)
    dist.all_gather_into_tensor(out, make_data(case, rank, dtype, count))
    assert_equal(out, torch.cat([make_data(case, r, dtype, count) for r in range(world)]), "all_gather_into_tensor")


def check_barrier(rank, world):
    """Three barriers; after each, every rank's arrival file (written just before it) must exist."""
    folder = os.path.dirname(os.environ["SHMCOLL_TEST_REPORT"])
    for round_ in range(3):
        open(os.path.join(folder, f"arrived-{round_}-{rank}"), "w").close()
        dist.barrier()
        missing = [r for r in range(world) if not os.path.exists(os.path.join(folder, f"arrived-{round_}-{r}"))]
        assert not missing, f"barrier round {round_} returned before ranks {missing} arrived"


def _gather_into_strided_outputs(rank, world):
    grid = torch.zeros(101, world)
    outs = [grid[:, r] for r in range(world)]
    dist.all_gather(outs, make_data("strided", rank, torch.float32, 101))
    for r in range(world):
        assert_equal(grid[:, r], make_data("strided", r, torch.float32, 101), f"strided output {r}")


def _broadcast_strided(rank, world):
    grid = torch.zeros(77, 3)
    if rank == world - 1:
        grid[:, 1] = make_data("bstrided", 0, torch.float32, 77)
    dist.broadcast(grid[:, 1], src=world - 1)
    assert_equal(grid[:, 1], make_data("bstrided", 0, torch.float32, 77), "strided broadcast")
    assert_equal(grid[:, 0], torch.zeros(77), "untouched neighbours")


# After the sizes: strided tensors (the neighbours of a column stay untouched), and the barrier.
STRIDED_AND_BARRIER = {"all_gather/strided_outputs": _gather_into_strided_outputs,
                       "broadcast/strided": _broadcast_strided, "barrier": check_barrier}
