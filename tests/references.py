"""What every rank of a scenario can rebuild: each rank's input, the result a collective must give, the check.

Inputs are generated from (case, rank) seeds, so every rank can rebuild every
other rank's input and compute the expected result locally. Values are chosen
so that sums and products are exact in every dtype and any order; the
scenarios then also compare results with Gloo's where Gloo supports the
combination.
"""
from __future__ import annotations

import functools
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
    """op name -> ReduceOp, for the ops the scenarios reduce ``dtype`` with (bitwise ones on integers and bool,
    AVG on floating types)."""
    ops = dict(ARITH_OPS)
    if not dtype.is_floating_point:
        ops.update(BIT_OPS)
    else:
        ops["avg"] = R.AVG
    return ops


def element_counts(world: int, big: int) -> list[int]:
    """Sizes every collective of a scenario is run at: none, one, odd, a few per rank, and ``big`` (which the
    test picks to pass a chunk, a lane or a span)."""
    return sorted({0, 1, 7, world * 5 + 1, 1000, big})


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


def make_data(case: str, rank: int, dtype, count: int) -> torch.Tensor:
    """``make_input`` for the collectives that only move data, complex64 too (made as its float32 real view)."""
    if dtype.is_complex:
        return torch.view_as_complex(make_input(case, rank, torch.float32, 2 * count).reshape(count, 2))
    return make_input(case, rank, dtype, count)


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


def split_rows(case: str, rank: int, table, width: int) -> torch.Tensor:
    """``rank``'s input of an all_to_all_single with uneven splits: ``table[rank][j]`` rows of ``width`` for
    rank j, in rank order."""
    return make_data(case, rank, torch.float32, sum(table[rank]) * width).reshape(-1, width)


def rows_received(case: str, rank: int, table, width: int) -> torch.Tensor:
    """What ``rank`` must receive from that all_to_all_single: each sender's rows for it, in rank order."""
    pieces = []
    for sender, sends in enumerate(table):
        start = sum(sends[:rank])
        pieces.append(split_rows(case, sender, table, width)[start:start + sends[rank]])
    return torch.cat(pieces)


def assert_equal(actual, expected, what):
    """Bit for bit: the inputs are exact under every order, so any difference is a wrong result."""
    if not torch.equal(actual, expected):
        diff = (actual != expected).nonzero()
        first = int(diff[0]) if len(diff) else -1
        raise AssertionError(f"{what}: {len(diff)} of {actual.numel()} elements differ; first at {first}: "
                             f"got {actual.reshape(-1)[first].item()}, expected {expected.reshape(-1)[first].item()}")


def assert_refused(call, errors, words, what: str) -> None:
    """``call()`` must raise one of ``errors``, whose text says every one of ``words``."""
    try:
        call()
    except errors as error:
        missing = [word for word in words if word not in str(error)]
        assert not missing, f"{what}: the error does not say {missing}: {error}"
    else:
        raise AssertionError(f"{what} was not refused")
