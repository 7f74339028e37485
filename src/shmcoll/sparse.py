"""All-reduce of sparse COO tensors, with Gloo's results, through the placement's all-gathers.

What Gloo computes (ProcessGroupGloo's AsyncSparseAllreduceWork), step for step:
coalesce the input, gather every rank's indices and values, add the ranks'
sparse tensors one by one in rank order and coalesce the sum; the caller's
tensor then takes the result (``copy_``). Each addition rounds, so an element's
sum is ((rank 0 + rank 1) + rank 2) + ...: concatenating the parts and
coalescing once is *not* the same, because torch's coalesce does not keep equal
indices in rank order (from three ranks on, the last bits differ). Gloo always
sums, whatever the op; here any op but SUM is refused rather than silently
summed. The table is never densified: what moves is every rank's (indices,
values), padded to the largest nnz.

Three all-gathers: a fixed-size header (nnz, dims, shape) that every rank
checks against its own, then the indices, then the values. Every rank then
sums the parts in one merge pass (``shmcoll._merge``) that makes those
additions in that order; the dtypes without a reduction kernel run Gloo's own
additions.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from shmcoll import _merge, kernel_abi, ops

_MAX_DIMS = 64  # torch's own limit on a tensor's dimensions
_HEADER = 4 + _MAX_DIMS  # nnz, sparse dims, dense dims, dims, then the shape


def check_op(redop) -> None:
    kind = ops.kind_of(redop)
    if kind != dist.ReduceOp.RedOpType.SUM:
        raise ValueError(f"all_reduce of a sparse tensor: only ReduceOp.SUM is supported (Gloo sums whatever "
                         f"op it is given), got {kind.name}")


def allreduce(tensor: torch.Tensor, placement, rank: int, size: int) -> torch.Tensor:
    """Sum the sparse COO ``tensor`` over the group, in place (as Gloo does); return the result."""
    local = tensor.coalesce()
    if local.dim() > _MAX_DIMS:
        raise ValueError(f"all_reduce of a sparse tensor with {local.dim()} dimensions (at most {_MAX_DIMS})")
    header = torch.zeros(_HEADER, dtype=torch.int64)
    header[:4] = torch.tensor([local._nnz(), local.sparse_dim(), local.dense_dim(), local.dim()])
    header[4:4 + local.dim()] = torch.tensor(local.shape, dtype=torch.int64)
    headers = _gather(placement, header, size)
    _check_agreement(headers, header, local, rank)
    counts = headers[:, 0].tolist()
    most = max(counts)
    sparse_dim, dense_shape = local.sparse_dim(), local.shape[local.sparse_dim():]
    # Padded to the largest nnz; the padding is never read, so it is left unset.
    indices = torch.empty(most, sparse_dim, dtype=torch.int64)
    indices[:counts[rank]] = local._indices().t()
    values = torch.empty((most, *dense_shape), dtype=local.dtype)
    values[:counts[rank]] = local._values()
    all_indices = _gather(placement, indices, size)
    all_values = _gather(placement, values, size)
    merge = _merge_kernel(local.dtype)
    if merge is not None:
        result = _merged(all_indices, all_values, counts, local.shape, merge)
    else:
        result = _added(all_indices, all_values, counts, local.shape)
    tensor.copy_(result)
    return result


def _merge_kernel(dtype: torch.dtype) -> int | None:
    """Address of the SUM kernel that adds one value row to another, or None where torch must do it
    (bool and the dtypes the kernels do not have)."""
    name = str(dtype).removeprefix("torch.")
    if name not in kernel_abi.DTYPES or name == "bool":  # a bool "sum" is torch's to define
        return None
    from shmcoll import kernel_library  # loads the kernels: not at import

    return kernel_library.entry_point(name)


def _merged(all_indices: torch.Tensor, all_values: torch.Tensor, counts: list, shape, kernel: int):
    """The coalesced sum of the gathered parts, merged in one pass (``shmcoll._merge``)."""
    size, most, sparse_dim = all_indices.shape
    dense_shape = all_values.shape[2:]
    capacity = sum(counts)
    row_elems = math.prod(dense_shape)
    out_indices = torch.empty(sparse_dim, capacity, dtype=torch.int64)
    out_values = torch.empty((capacity, *dense_shape), dtype=all_values.dtype)
    rows = torch.tensor(counts, dtype=torch.int64)
    nnz = _merge.merge(all_indices.data_ptr(), all_values.data_ptr(), rows.data_ptr(), size,
                       most, sparse_dim, row_elems, row_elems * all_values.element_size(),
                       out_indices.data_ptr(), out_values.data_ptr(), capacity, kernel, kernel_abi.SUM)
    return torch.sparse_coo_tensor(out_indices[:, :nnz], out_values[:nnz], shape, is_coalesced=True,
                                   check_invariants=False)


def _added(all_indices: torch.Tensor, all_values: torch.Tensor, counts: list, shape):
    """Gloo's own code for the dtypes without a kernel: the parts added one by one, in rank order, so
    the same result, or the same error where torch's sparse addition has no such dtype (bool, float16)."""
    def part(r):
        return torch.sparse_coo_tensor(all_indices[r, :counts[r]].t(), all_values[r, :counts[r]], shape,
                                       check_invariants=False)

    result = part(0)
    for r in range(1, len(counts)):
        result += part(r)
    return result.coalesce()


def _gather(placement, part: torch.Tensor, size: int) -> torch.Tensor:
    """Every rank's ``part``, stacked in rank order (one all-gather of the placement)."""
    whole = torch.empty((size, *part.shape), dtype=part.dtype)
    code = ops.movement_code(part.dtype)
    count = part.numel() if code else part.numel() * part.element_size()
    placement.allgather_into(whole, part, ops.descriptor(ops.ALLGATHER, count, code))
    return whole


def _check_agreement(headers: torch.Tensor, mine: torch.Tensor, local: torch.Tensor, rank: int) -> None:
    """Every rank sees every header, so all raise the same error together, none waits."""
    differ = [r for r in range(headers.shape[0]) if not torch.equal(headers[r, 1:], mine[1:])]
    if differ:
        other = headers[differ[0]]
        shape = tuple(other[4:4 + int(other[3])].tolist())
        raise ValueError(f"all_reduce of sparse tensors: rank {rank} has shape {tuple(local.shape)} with "
                         f"{local.sparse_dim()} sparse dimension(s) but rank(s) {', '.join(map(str, differ))} "
                         f"differ (rank {differ[0]}: shape {shape}, {int(other[1])} sparse dimension(s))")
