"""all_reduce of every dtype with every op the scenarios reduce it with, at every size of ``element_counts``,
against the local reference and against Gloo; then a strided and a 3-d tensor."""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.references import ALL_DTYPES, assert_equal, element_counts, make_input, ops_for, reference_reduce

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


def _non_contiguous(rank, world):
    base = torch.stack([make_input("nc", rank, torch.float32, 999), torch.full((999,), -7.0)], dim=1)
    column = base[:, 0]
    assert not column.is_contiguous()
    dist.all_reduce(column)
    expected = reference_reduce([make_input("nc", r, torch.float32, 999) for r in range(world)], "sum",
                                torch.float32)
    assert_equal(base[:, 0], expected, "strided all_reduce")
    assert_equal(base[:, 1], torch.full((999,), -7.0), "untouched neighbours")


def _three_dimensions(rank, world):
    t = make_input("shape", rank, torch.float32, 60).reshape(3, 4, 5)
    dist.all_reduce(t)
    expected = reference_reduce([make_input("shape", r, torch.float32, 60) for r in range(world)], "sum",
                                torch.float32)
    assert_equal(t.reshape(-1), expected, "3-d all_reduce")


# Tensors that are not one contiguous vector, after the matrix.
LAYOUTS = {"all_reduce/non_contiguous": _non_contiguous, "all_reduce/3d": _three_dimensions}


def allreduce_matrix(cases, big: str = "5003"):
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    for dtype in ALL_DTYPES:
        for op_name, op in ops_for(dtype).items():
            for count in element_counts(world, int(big)):
                case = f"all_reduce/{str(dtype)[6:]}/{op_name}/n={count}"

                def run():
                    inputs = [make_input(case, r, dtype, count, op_name) for r in range(world)]
                    expected = reference_reduce(inputs, op_name, dtype)
                    tensor = inputs[rank].clone()
                    dist.all_reduce(tensor, op=op)
                    assert_equal(tensor, expected, "shm vs local reference")
                    theirs = _gloo_all_reduce(inputs[rank].clone(), op, gloo)
                    if theirs is not None:
                        assert_equal(tensor, theirs, "shm vs gloo")

                cases.run(case, run)
    cases.run_each(LAYOUTS, rank, world)


def allreduce_matrix_cases(world: int, big: str = "5003") -> int:
    """How many cases ``allreduce_matrix`` runs on each rank."""
    matrix = sum(len(ops_for(dtype)) for dtype in ALL_DTYPES) * len(element_counts(world, int(big)))
    return matrix + len(LAYOUTS)
