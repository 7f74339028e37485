"""Scenarios run inside spawned ranks (see tests/worker.py); each records cases.

Inputs are generated from (case, rank) seeds, so every rank can rebuild every
other rank's input and compute the expected result locally. Values are chosen
so that sums and products are exact in every dtype and any order; results are
then also compared with Gloo's where Gloo supports the combination.
"""
from __future__ import annotations

import functools
import os
import zlib

import torch
import torch.distributed as dist

R = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
ALL_DTYPES = FLOATS + INTS + [torch.bool]
ARITH_OPS = {"sum": R.SUM, "product": R.PRODUCT, "min": R.MIN, "max": R.MAX}
BIT_OPS = {"band": R.BAND, "bor": R.BOR, "bxor": R.BXOR}


def ops_for(dtype):
    ops = dict(ARITH_OPS)
    if not dtype.is_floating_point:
        ops.update(BIT_OPS)
    else:
        ops["avg"] = R.AVG
    return ops


def make_input(case: str, rank: int, dtype, count: int, op_name: str = "sum") -> torch.Tensor:
    """Deterministic input of ``rank`` for ``case``; exact under the op in every order."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{case}/{rank}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=g).bool()
    if dtype.is_floating_point:
        if op_name == "product":  # powers of two: products stay exact
            choices = torch.tensor([0.5, 1.0, 2.0, -1.0, -0.5])
            return choices[torch.randint(0, 5, (count,), generator=g)].to(dtype)
        return (torch.randint(-32, 33, (count,), generator=g).to(torch.float64) / 4).to(dtype)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -1000), min(info.max, 1000)
    return torch.randint(low, high + 1, (count,), generator=g, dtype=torch.int64).to(dtype)


def reference_reduce(inputs, op_name: str, dtype):
    """The result every rank must get: rank-order reduction, half types in float32 rounded once."""
    acc_type = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    xs = [x.to(acc_type) for x in inputs]
    fn = {"sum": torch.add, "avg": torch.add, "product": torch.mul, "min": torch.minimum, "max": torch.maximum,
          "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op_name]
    if dtype == torch.bool:
        fn = {"sum": torch.logical_or, "max": torch.logical_or, "bor": torch.logical_or,
              "product": torch.logical_and, "min": torch.logical_and, "band": torch.logical_and,
              "bxor": torch.logical_xor}[op_name]
    out = functools.reduce(fn, xs)
    if op_name == "avg":  # the correctly rounded mean, as Gloo computes it
        out = out / len(inputs)
    return out.to(dtype)


def _equal(actual, expected, what):
    if not torch.equal(actual, expected):
        diff = (actual != expected).nonzero()
        first = int(diff[0]) if len(diff) else -1
        raise AssertionError(f"{what}: {len(diff)} of {actual.numel()} elements differ; first at {first}: "
                             f"got {actual.reshape(-1)[first].item()}, expected {expected.reshape(-1)[first].item()}")


# What Gloo itself refuses (checked on every rank before any communication).
_GLOO_REFUSALS = ("Invalid scalar type", "Cannot use ReduceOp", "not supported")


def _gloo_all_reduce(tensor, op, group):
    """Gloo's result, or None where Gloo does not support the dtype/op."""
    try:
        dist.all_reduce(tensor, op=op, group=group)
    except RuntimeError as error:
        if any(text in str(error) for text in _GLOO_REFUSALS):
            return None
        raise
    return tensor


def _counts(world: int, big: int):
    return sorted({0, 1, 7, world * 5 + 1, 1000, big})


def allreduce_matrix(cases, big: str = "5003"):
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    for dtype in ALL_DTYPES:
        for op_name, op in ops_for(dtype).items():
            for count in _counts(world, int(big)):
                case = f"all_reduce/{str(dtype)[6:]}/{op_name}/n={count}"

                def run():
                    inputs = [make_input(case, r, dtype, count, op_name) for r in range(world)]
                    expected = reference_reduce(inputs, op_name, dtype)
                    tensor = inputs[rank].clone()
                    dist.all_reduce(tensor, op=op)
                    _equal(tensor, expected, "shm vs local reference")
                    theirs = _gloo_all_reduce(inputs[rank].clone(), op, gloo)
                    if theirs is not None:
                        _equal(tensor, theirs, "shm vs gloo")

                cases.run(case, run)

    def non_contiguous():
        base = torch.stack([make_input("nc", rank, torch.float32, 999), torch.full((999,), -7.0)], dim=1)
        column = base[:, 0]
        assert not column.is_contiguous()
        dist.all_reduce(column)
        expected = reference_reduce([make_input("nc", r, torch.float32, 999) for r in range(world)], "sum",
                                    torch.float32)
        _equal(base[:, 0], expected, "strided all_reduce")
        _equal(base[:, 1], torch.full((999,), -7.0), "untouched neighbours")

    cases.run("all_reduce/non_contiguous", non_contiguous)

    def shapes():
        t = make_input("shape", rank, torch.float32, 60).reshape(3, 4, 5)
        dist.all_reduce(t)
        expected = reference_reduce([make_input("shape", r, torch.float32, 60) for r in range(world)], "sum",
                                    torch.float32)
        _equal(t.reshape(-1), expected, "3-d all_reduce")

    cases.run("all_reduce/3d", shapes)


def data_movement(cases, big: str = "300001"):
    rank, world = dist.get_rank(), dist.get_world_size()
    dtypes = [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64, torch.uint8]
    for dtype in dtypes:
        for count in _counts(world, int(big)):
            for root in range(world):
                case = f"broadcast/{str(dtype)[6:]}/n={count}/root={root}"

                def bcast():
                    expected = _data(case, root, dtype, count)
                    t = expected.clone() if rank == root else torch.zeros(count, dtype=dtype)
                    dist.broadcast(t, src=root)
                    _equal(t, expected, "broadcast")

                cases.run(case, bcast)

            case = f"all_gather/{str(dtype)[6:]}/n={count}"

            def gather_list():
                outs = [torch.zeros(count, dtype=dtype) for _ in range(world)]
                dist.all_gather(outs, _data(case, rank, dtype, count))
                for r in range(world):
                    _equal(outs[r], _data(case, r, dtype, count), f"all_gather slot {r}")

            cases.run(case, gather_list)

            case = f"all_gather_into_tensor/{str(dtype)[6:]}/n={count}"

            def gather_tensor():
                out = torch.zeros(world * count, dtype=dtype)
                dist.all_gather_into_tensor(out, _data(case, rank, dtype, count))
                _equal(out, torch.cat([_data(case, r, dtype, count) for r in range(world)]),
                       "all_gather_into_tensor")

            cases.run(case, gather_tensor)

    def gather_strided_outputs():
        grid = torch.zeros(101, world)
        outs = [grid[:, r] for r in range(world)]
        dist.all_gather(outs, _data("strided", rank, torch.float32, 101))
        for r in range(world):
            _equal(grid[:, r], _data("strided", r, torch.float32, 101), f"strided output {r}")

    cases.run("all_gather/strided_outputs", gather_strided_outputs)

    def broadcast_strided():
        grid = torch.zeros(77, 3)
        if rank == world - 1:
            grid[:, 1] = _data("bstrided", 0, torch.float32, 77)
        dist.broadcast(grid[:, 1], src=world - 1)
        _equal(grid[:, 1], _data("bstrided", 0, torch.float32, 77), "strided broadcast")
        _equal(grid[:, 0], torch.zeros(77), "untouched neighbours")

    cases.run("broadcast/strided", broadcast_strided)

    def barrier():
        folder = os.path.dirname(os.environ["SHMCOLL_TEST_REPORT"])
        for round_ in range(3):
            open(os.path.join(folder, f"arrived-{round_}-{rank}"), "w").close()
            dist.barrier()
            missing = [r for r in range(world) if not os.path.exists(os.path.join(folder, f"arrived-{round_}-{r}"))]
            assert not missing, f"barrier round {round_} returned before ranks {missing} arrived"

    cases.run("barrier", barrier)


def _data(case, rank, dtype, count):
    if dtype.is_complex:
        return torch.view_as_complex(make_input(case, rank, torch.float32, 2 * count).reshape(count, 2))
    return make_input(case, rank, dtype, count)
