"""Every reduction with every op and dtype it accepts, on any placement, against a local reference.

all_reduce, reduce (every root), reduce_scatter_tensor and reduce_scatter, each
with every (op, dtype) torch lets a CPU group see: SUM, AVG, PRODUCT, MIN, MAX,
BAND, BOR, BXOR and PREMUL_SUM (a scalar and a tensor factor) over float32/64,
float16, bfloat16, int8/16/32/64, uint8, bool and complex64/128, at sizes that
take each plan (``counts``); then every (op, dtype) the calls must refuse, which
must raise the same error on every rank before any data moves and leave the
group usable. One job runs them all, so that a layout costs one start-up.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.references import assert_equal, assert_refused, make_input, reference_reduce

R = dist.ReduceOp
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
COMPLEX = (torch.complex64, torch.complex128)
DTYPES = FLOATS + INTS + (torch.bool,) + COMPLEX

# PREMUL_SUM's factors: powers of two, so that where the factor applies (each input, or a node's partial)
# cannot change a bit of the exact sums of these inputs; a factor applied twice or never still shows.
PREMUL_SCALAR, PREMUL_TENSOR = 0.5, 0.25


def accepted_ops(dtype) -> dict:
    """op name -> ReduceOp, for every op a reduction of ``dtype`` must compute (torch's and NCCL's rules:
    bitwise ops on integers and bool, AVG and PREMUL_SUM on floating and complex tensors, complex tensors
    only the linear ops)."""
    if dtype.is_complex:
        names = ("sum", "avg", "premul", "premul_tensor")
    elif dtype.is_floating_point:
        names = ("sum", "avg", "product", "min", "max", "premul", "premul_tensor")
    elif dtype == torch.bool:
        names = ("sum", "product", "min", "max", "band", "bor", "bxor")
    else:
        names = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")
    return {name: _op(name) for name in names}


def refused_ops(dtype) -> dict:
    """op name -> ReduceOp, for every op a reduction of ``dtype`` must refuse; complex MIN, MAX, PRODUCT and
    the bitwise ops are refused by torch itself before the group sees them."""
    if dtype.is_complex:
        return {}
    if dtype.is_floating_point:
        names = ("band", "bor", "bxor")
    elif dtype == torch.bool:
        names = ("avg", "premul", "premul_tensor")
    else:
        names = ("premul", "premul_tensor")
    return {name: _op(name) for name in names}


def _op(name: str):
    if name == "premul":
        return dist._make_nccl_premul_sum(PREMUL_SCALAR)
    if name == "premul_tensor":
        return dist._make_nccl_premul_sum(torch.tensor(PREMUL_TENSOR))
    return getattr(R, name.upper())


def data(case: str, rank: int, dtype, count: int, op_name: str) -> torch.Tensor:
    """``rank``'s input of ``case``: a complex tensor's real and imaginary parts are made as its real view."""
    if dtype.is_complex:
        real = torch.float32 if dtype == torch.complex64 else torch.float64
        return torch.view_as_complex(make_input(case, rank, real, 2 * count, op_name).reshape(count, 2))
    return make_input(case, rank, dtype, count, op_name)


def expected(inputs: list[torch.Tensor], op_name: str, dtype) -> torch.Tensor:
    """The reduction of ``inputs`` in rank order (tests.references.reference_reduce), complex ones as real views,
    PREMUL_SUM as the sum of each input times its factor."""
    if dtype.is_complex:
        reals = [torch.view_as_real(x) for x in inputs]
        return torch.view_as_complex(expected(reals, op_name, reals[0].dtype).contiguous())
    if op_name.startswith("premul"):
        factor = PREMUL_SCALAR if op_name == "premul" else PREMUL_TENSOR
        wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        return reference_reduce([x.to(wide) * factor for x in inputs], "sum", wide).to(dtype)
    return reference_reduce(inputs, op_name, dtype)


def counts(world: int, itemsize: int, small_bytes: int, segment_bytes: int, per_rank: bool) -> list[int]:
    """Element counts (of one rank's part for a reduce-scatter) that take each plan: none, 1, odd, either side
    of ``small_bytes`` (the plans across nodes compare the whole message with it), several segments."""
    unit = itemsize * (world if per_rank else 1)  # bytes of the whole message per element counted
    small = small_bytes // unit
    return sorted({0, 1, 7, small, small + 1, 3 * segment_bytes // unit + 5})


def every_reduction(cases, small_bytes: str = "1024", segment_bytes: str = "4096", dtypes: str = ""):
    """``dtypes``: names to keep (comma-separated), for the slowest layouts; all of them if empty."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for name, check, args in planned(world, int(small_bytes), int(segment_bytes), dtypes):
        cases.run(name, check, name, rank, world, *args)


def planned(world: int, small: int, segment: int, dtypes: str = "") -> list:
    """(case name, check, its arguments after (case, rank, world)) of every case, in the order they run."""
    keep = set(dtypes.split(",")) if dtypes else None
    plan = []
    for dtype in DTYPES:
        name = str(dtype).removeprefix("torch.")
        if keep is not None and name not in keep:
            continue
        itemsize = torch.empty(0, dtype=dtype).element_size()
        for op_name, op in accepted_ops(dtype).items():
            for count in counts(world, itemsize, small, segment, per_rank=False):
                plan.append((f"all_reduce/{name}/{op_name}/n={count}", _all_reduce, (dtype, op_name, op, count)))
                plan += [(f"reduce/{name}/{op_name}/n={count}/root={root}", check_reduce,
                          (dtype, op_name, op, count, root)) for root in range(world)]
            for count in counts(world, itemsize, small, segment, per_rank=True):
                plan.append((f"reduce_scatter_tensor/{name}/{op_name}/n={count}", check_reduce_scatter,
                             (dtype, op_name, op, count, False)))
                plan.append((f"reduce_scatter/{name}/{op_name}/n={count}", check_reduce_scatter,
                             (dtype, op_name, op, count, True)))
        plan += [(f"refused/{name}/{op_name}", _refused, (dtype, op_name, op))
                 for op_name, op in refused_ops(dtype).items()]
    plan += [(f"shapes/{str(dtype).removeprefix('torch.')}", _shapes, (dtype, small))
             for dtype in (torch.float32, torch.complex64, torch.int16)]
    return plan


def _all_reduce(case, rank, world, dtype, op_name, op, count):
    inputs = [data(case, r, dtype, count, op_name) for r in range(world)]
    tensor = inputs[rank].clone()
    dist.all_reduce(tensor, op=op)
    assert_equal(tensor, expected(inputs, op_name, dtype), "all_reduce")


def check_reduce(case, rank, world, dtype, op_name, op, count, root):
    """reduce to ``root``: the reduction there, every other rank's tensor as it was."""
    inputs = [data(case, r, dtype, count, op_name) for r in range(world)]
    tensor = inputs[rank].clone()
    dist.reduce(tensor, dst=root, op=op)
    if rank == root:
        assert_equal(tensor, expected(inputs, op_name, dtype), "reduce at the root")
    else:
        assert_equal(tensor, inputs[rank], "reduce leaves the other ranks' tensors alone")


def check_reduce_scatter(case, rank, world, dtype, op_name, op, count, as_list):
    """reduce_scatter (``as_list``: of a list of tensors) or reduce_scatter_tensor: this rank's block of the
    reduction, and its input as it was."""
    inputs = [data(case, r, dtype, count * world, op_name) for r in range(world)]
    out = torch.zeros(count, dtype=dtype)
    mine = inputs[rank].clone()
    if as_list:
        dist.reduce_scatter(out, list(mine.split(count)) if count else [mine] * world, op=op)
    else:
        dist.reduce_scatter_tensor(out, mine, op=op)
    assert_equal(out, expected(inputs, op_name, dtype)[rank * count:(rank + 1) * count], "reduce_scatter")
    assert_equal(mine, inputs[rank], "reduce_scatter leaves its input alone")


def _refused(case, rank, world, dtype, op_name, op):
    """Each reduction of an (op, dtype) it cannot compute raises on every rank, naming both and the call, and the
    group goes on (an all_reduce right after it is right)."""
    calls = {
        "all_reduce": lambda t: dist.all_reduce(t, op=op),
        "reduce": lambda t: dist.reduce(t, dst=world - 1, op=op),
        "reduce_scatter": lambda t: dist.reduce_scatter_tensor(t, t.repeat(world), op=op),
    }
    for what, call in calls.items():
        wanted = ("PREMUL_SUM" if op_name.startswith("premul") else op_name.upper(), str(dtype), what)
        assert_refused(lambda: call(torch.ones(3, dtype=dtype)), (ValueError, TypeError), wanted,
                       f"{what} of {dtype} with {op_name}")
    _all_reduce(f"{case}/after", rank, world, torch.float32, "sum", R.SUM, 5)


def _shapes(case, rank, world, dtype, small):
    """Tensors of more than one dimension, and a non-contiguous one, below and above ``small`` bytes."""
    for count in (6, 6 * (small // torch.empty(0, dtype=dtype).element_size() // 6 + 1)):
        inputs = [data(f"{case}/{count}", r, dtype, count, "sum").reshape(2, 3, -1) for r in range(world)]
        tensor = inputs[rank].clone()
        dist.all_reduce(tensor)
        assert_equal(tensor, expected(inputs, "sum", dtype), f"all_reduce of shape {tuple(tensor.shape)}")
        tensor = inputs[rank].clone()
        dist.reduce(tensor, dst=0)
        assert_equal(tensor, expected(inputs, "sum", dtype) if rank == 0 else inputs[rank], "reduce of 3 dimensions")
        grid = torch.zeros(count, 2, dtype=dtype)
        grid[:, 0] = inputs[rank].reshape(-1)
        dist.all_reduce(grid[:, 0])
        assert_equal(grid[:, 0], expected(inputs, "sum", dtype).reshape(-1), "strided all_reduce")
        assert_equal(grid[:, 1], torch.zeros(count, dtype=dtype), "strided all_reduce's neighbours")
