"""Every collective that has a measured single-copy span, at each edge of the span and one element either side,
against local references: in the default mode the path changes at those sizes (tests/test_single_copy.py makes
the probe find cheap reads), so each size must be right on both paths and on every rank alike."""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.movement_scenarios import check_all_gather_into_tensor, check_broadcast
from tests.references import assert_equal, make_input, reference_reduce

SPAN_DTYPES = (torch.float32, torch.bfloat16)


def _edges():
    """(collective, edge in bytes per rank) of every edge of placement.node.SINGLE_COPY_SPANS."""
    from shmcoll.placement.node import SINGLE_COPY_SPANS

    return [(kind, edge) for kind, span in SINGLE_COPY_SPANS.items() for edge in span if edge is not None]


def _around(edge: int, dtype) -> tuple[int, int, int]:
    """Element counts one below, at and one above ``edge`` bytes."""
    itemsize = torch.tensor([], dtype=dtype).element_size()
    return edge // itemsize - 1, edge // itemsize, edge // itemsize + 1


def around_spans(cases):
    rank, world = dist.get_rank(), dist.get_world_size()
    for kind, edge in _edges():
        for dtype in SPAN_DTYPES:
            for count in _around(edge, dtype):
                case = f"{kind}/{str(dtype)[6:]}/n={count}"
                cases.run(case, _at_a_span_edge, kind, case, rank, world, dtype, count)


def around_spans_cases() -> int:
    """How many cases ``around_spans`` runs on each rank."""
    return sum(len(_around(edge, dtype)) for _, edge in _edges() for dtype in SPAN_DTYPES)


def _at_a_span_edge(kind, case, rank, world, dtype, count):
    """One call of ``kind`` whose per-rank size (what the span is of) is ``count`` elements."""
    if kind == "all_gather":
        return check_all_gather_into_tensor(case, rank, world, dtype, count)
    if kind == "broadcast":
        return check_broadcast(case, rank, world - 1, dtype, count)
    if kind == "all_reduce":
        inputs = [make_input(case, r, dtype, count) for r in range(world)]
        tensor = inputs[rank].clone()
        dist.all_reduce(tensor)
        return assert_equal(tensor, reference_reduce(inputs, "sum", dtype), "all_reduce")
    inputs = [make_input(case, r, dtype, count * world) for r in range(world)]  # reduce_scatter
    out = torch.zeros(count, dtype=dtype)
    dist.reduce_scatter_tensor(out, inputs[rank].clone())
    assert_equal(out, reference_reduce(inputs, "sum", dtype)[rank * count:(rank + 1) * count],
                 "reduce_scatter_tensor")
