"""All-reduce of sparse COO tensors, with Gloo's results, through the placement's all-gathers.

What Gloo computes (ProcessGroupGloo's AsyncSparseAllreduceWork), step for step:
coalesce the input, gather every rank's indices and values, add the ranks'
sparse tensors in rank order and coalesce the sum; the caller's tensor then
takes the result (``copy_``). Adding uncoalesced sparse tensors concatenates
them, so here the parts are concatenated once, in rank order, and coalesced. Gloo always sums, whatever the op; here any op
but SUM is refused rather than silently summed. The table is never densified:
what moves is every rank's (indices, values), padded to the largest nnz.

Three all-gathers: a fixed-size header (nnz, dims, shape) that every rank
checks against its own, then the indices, then the values.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from shmcoll import ops

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
    # Gloo adds the ranks' parts one by one; adding uncoalesced sparse tensors concatenates
    # them, so one concatenation in rank order and one coalesce give its result, bit for bit.
    every_index = torch.cat([all_indices[r, :counts[r]] for r in range(size)]).t()
    every_value = torch.cat([all_values[r, :counts[r]] for r in range(size)])
    # Each rank's rows are valid and coalesced (it built them itself): no need for torch's
    # invariant checks (and saying so spares the user torch's warning that they are off).
    result = torch.sparse_coo_tensor(every_index, every_value, local.shape, dtype=local.dtype,
                                     check_invariants=False).coalesce()
    tensor.copy_(result)
    return result


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
