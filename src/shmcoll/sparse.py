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

All-gathers: a header (nnz, dims, shape) that every rank checks against its
own, with this rank's indices when they fit the room the last call's sizes
set (else the indices follow in an all-gather of their own), then the
values. Every rank plans the merge over the gathered indices, then sums the
parts in one pass (``shmcoll._merge``) that makes those additions in that
order, reading each window of the values' all-gather where it lies in shared
memory; the dtypes without a reduction kernel run Gloo's own additions.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist

from shmcoll import _merge, _pool, descriptors, kernel_abi, ops
from shmcoll._logging import log

_MAX_DIMS = 64  # torch's own limit on a tensor's dimensions
_HEADER = 4 + _MAX_DIMS  # nnz, sparse dims, dense dims, dims, then the shape
# Past this many int64s of indices (1 MiB) a rank's indices take longer to gather than the ranks' meeting
# costs: the header goes alone and the indices follow.
ROOM_MAX = 1 << 17


def check_op(redop) -> None:
    kind = ops.kind_of(redop)
    if kind != dist.ReduceOp.RedOpType.SUM:
        raise ValueError(f"all_reduce of a sparse tensor: only ReduceOp.SUM is supported (Gloo sums whatever "
                         f"op it is given), got {kind.name}")


class Buffers:
    """The memory a group's sparse all_reduces reuse from call to call.

    A call needs buffers about the size of the gradient (this rank's part, the
    sort of its indices, the header with them and every rank's headers, every
    rank's indices, the stash where the merge keeps value rows it cannot take
    yet, at their place among every rank's), the merge's steps (4 bytes per
    gathered row) and the plan's room (16 bytes per gathered row). New memory is slow to fill the
    first time (page faults: on the 2-core VM, 4 MiB of new memory took ~1 ms to
    fill, reused memory 0.07 ms), and a DDP step sends a gradient of about the
    same size every step, so each buffer is kept and grown, never shrunk. A
    buffer above ``KEEP_BYTES`` is dropped at the end of its call (``trim``): a
    one-off huge tensor must not pin that much memory for the group's life. The
    sum goes to memory that the caller keeps; it comes from ``shmcoll._pool``,
    which takes it back when torch frees it (DDP drops a step's gradient before
    the next step's sum), so it too is reused rather than faulted in anew: at
    most ``KEEP_BYTES`` in all. The collectives of a group run one at a time
    (issue order), so one set serves them all.
    """

    KEEP_BYTES = 64 << 20

    def __init__(self):
        self._kept: dict[str, torch.Tensor] = {}
        self._results = _pool.Pool(self.KEEP_BYTES)
        self.indices_room = 0  # what every rank's next header carries of its indices (_room_after)

    def result(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of memory (uint8) for a result the caller keeps: the pool's while it has room, else new."""
        lent = self._results.lend(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8) if lent is None else torch.from_dlpack(lent)

    def rows(self, name: str, count: int, row_shape: tuple, dtype: torch.dtype, keep: int = 0) -> torch.Tensor:
        """A [count, *row_shape] tensor of ``dtype`` in buffer ``name``; the first ``keep`` rows hold what they
        held in the last call's rows (when the buffer must grow, they are copied)."""
        row_bytes = math.prod(row_shape) * dtype.itemsize
        nbytes = count * row_bytes
        buffer = self._kept.get(name)
        if buffer is None or buffer.numel() < nbytes:
            grown = torch.empty(nbytes + nbytes // 4, dtype=torch.uint8)  # room for the next, slightly larger call
            if keep and buffer is not None:
                grown[:keep * row_bytes].copy_(buffer[:keep * row_bytes])
            buffer = self._kept[name] = grown
        return buffer[:nbytes].view(dtype).view(count, *row_shape)

    def trim(self) -> None:
        """Drop the buffers above ``KEEP_BYTES`` (at the end of a call: a later call allocates again)."""
        for name in [n for n, b in self._kept.items() if b.numel() > self.KEEP_BYTES]:
            del self._kept[name]


def allreduce(tensor: torch.Tensor, placement, rank: int, size: int, buffers: Buffers) -> None:
    """Sum the sparse COO ``tensor`` over the group, in place (as Gloo does)."""
    try:
        _allreduce(tensor, placement, rank, size, buffers)
    finally:
        buffers.trim()


def _allreduce(tensor: torch.Tensor, placement, rank: int, size: int, buffers: Buffers) -> None:
    if tensor.dim() > _MAX_DIMS:
        raise ValueError(f"all_reduce of a sparse tensor with {tensor.dim()} dimensions (at most {_MAX_DIMS})")
    kernel = _sum_kernel(tensor.dtype)
    sparse_dim, dense_shape = tensor.sparse_dim(), tuple(tensor.shape[tensor.sparse_dim():])
    # This rank's part, coalesced, straight into the buffers the all-gathers send from.
    if kernel is None:
        local = tensor.coalesce()
        nnz = local._nnz()
        buffers.rows("indices", nnz, (sparse_dim,), torch.int64).copy_(local._indices().t())
        buffers.rows("values", nnz, dense_shape, tensor.dtype).copy_(local._values())
    else:
        nnz = _coalesce_into(tensor, buffers, kernel)
    mine = [nnz, sparse_dim, len(dense_shape), tensor.dim(), *tensor.shape]
    # The header travels with this rank's indices when they fit the room every rank gives them (agreed
    # without a word: each sets it from the same gathered headers); then the ranks meet once for both.
    room = buffers.indices_room
    message = buffers.rows("message", _HEADER + max(room, nnz * sparse_dim), (), torch.int64)
    message[:_HEADER].copy_(torch.tensor(mine + [0] * (_HEADER - len(mine)), dtype=torch.int64))
    message[_HEADER:_HEADER + nnz * sparse_dim].copy_(buffers.rows("indices", nnz, (sparse_dim,), torch.int64).view(-1))
    messages = _gather(placement, message[:_HEADER + room],
                       buffers.rows("messages", size, (_HEADER + room,), torch.int64))
    headers = messages[:, :_HEADER].tolist()
    buffers.indices_room = _room_after(headers)
    _check_agreement(headers, tensor, rank)
    counts = [h[0] for h in headers]
    most = max(counts)
    # Padded to the largest part; the padding is never read, so it is left unset.
    indices = buffers.rows("indices", most, (sparse_dim,), torch.int64, keep=nnz)
    values = buffers.rows("values", most, dense_shape, tensor.dtype, keep=nnz)
    all_indices = buffers.rows("all_indices", size * most, (sparse_dim,), torch.int64).view(size, most, sparse_dim)
    if most * sparse_dim <= room:  # they came with the headers (the same test on every rank)
        all_indices.view(size, most * sparse_dim).copy_(messages[:, _HEADER:_HEADER + most * sparse_dim])
    else:
        _gather(placement, indices, all_indices.view(size * most, sparse_dim))
    if kernel is None:
        all_values = _gather(placement, values, buffers.rows("all_values", size * most, dense_shape, tensor.dtype))
        tensor.copy_(_added(all_indices, all_values.view(size, most, *dense_shape), counts, tensor.shape))
        return
    # The sum is written into new tensors of its exact size that become the tensor's own indices and values:
    # what tensor.copy_(sum) leaves, without copying the sum once more. As copy_ does, this replaces the
    # tensor's indices and values (tensors taken from it before keep the old ones) and bumps its version.
    tensor.data = _merged(placement, all_indices, values, counts, tensor.shape, kernel, buffers)
    torch.autograd.graph.increment_version(tensor)


def _room_after(headers: list) -> int:
    """The int64s of indices each rank sends with its header next call: this call's largest part, a quarter
    more (DDP sends gradients of about the same size step after step), at most ``ROOM_MAX``."""
    largest = max(h[0] * h[1] for h in headers)
    return min(largest + largest // 4, ROOM_MAX)


def _sum_kernel(dtype: torch.dtype) -> int | None:
    """Address of the SUM kernel that adds one value row to another, or None where torch must do it
    (bool and the dtypes the kernels do not have)."""
    name = str(dtype).removeprefix("torch.")
    if name not in kernel_abi.DTYPES or name == "bool":  # a bool "sum" is torch's to define
        return None
    from shmcoll import kernel_library  # loads the kernels: not at import

    return kernel_library.entry_point(name)


def _coalesce_into(tensor: torch.Tensor, buffers: Buffers, kernel: int) -> int:
    """``tensor.coalesce()``'s rows, written as rows of the "indices" and "values" buffers; their number."""
    nnz, sparse_dim = tensor._nnz(), tensor.sparse_dim()
    dense_shape = tuple(tensor.shape[sparse_dim:])
    indices = buffers.rows("indices", nnz, (sparse_dim,), torch.int64)
    values = buffers.rows("values", nnz, dense_shape, tensor.dtype)
    if tensor.is_coalesced() or nnz < 2:  # what coalesce() returns as it is
        indices.copy_(tensor._indices().t())
        values.copy_(tensor._values())
        return nnz
    # torch's coalesce sorts the flattened indices with torch.sort (not a stable one: equal indices come
    # out in the order it leaves them, and their sum depends on it), then sums along it.
    source_indices = tensor._indices().contiguous()
    source_values = tensor._values().contiguous()
    flat = _flattened(source_indices, tensor.shape)
    keys, order = buffers.rows("keys", nnz, (), torch.int64), buffers.rows("order", nnz, (), torch.int64)
    if nnz < _merge.SORTS_AS_TORCH_BELOW and _sorts_as_torch():
        _merge.sort(flat.data_ptr(), nnz, buffers.rows("pairs", nnz, (2,), torch.int64).data_ptr(),
                    keys.data_ptr(), order.data_ptr())
    else:  # the out= form runs the same kernel on a copy of the input, as the plain form does
        torch.sort(flat, 0, out=(keys, order))
    row_elems = math.prod(dense_shape)
    return _merge.coalesce(keys.data_ptr(), order.data_ptr(), nnz, source_indices.data_ptr(), sparse_dim,
                           source_values.data_ptr(), row_elems, row_elems * tensor.element_size(),
                           indices.data_ptr(), values.data_ptr(), kernel, kernel_abi.SUM)


@functools.cache
def _sorts_as_torch() -> bool:
    """Whether ``shmcoll._merge.sort`` leaves equal keys where this process's torch.sort does (asked once:
    it repeats the algorithm of the std::sort torch is built with, which a torch could change)."""
    generator = torch.Generator().manual_seed(0)
    # Few distinct keys (long runs of equal ones, as a skewed embedding has), more than the blocks of
    # its partition and the runs of its insertion sort cover, already-sorted and reversed stretches.
    keys = torch.cat([torch.randint(0, 97, (5000,), generator=generator), torch.arange(300) // 7,
                      torch.arange(300, 0, -1) // 5, torch.randint(0, 1 << 40, (400,), generator=generator)])
    expected = torch.sort(keys, 0)
    pairs = torch.empty((keys.numel(), 2), dtype=torch.int64)
    ours = torch.empty_like(keys), torch.empty_like(keys)
    _merge.sort(keys.data_ptr(), keys.numel(), pairs.data_ptr(), ours[0].data_ptr(), ours[1].data_ptr())
    same = torch.equal(expected.values, ours[0]) and torch.equal(expected.indices, ours[1])
    if not same:
        log.info("this torch's sort orders equal keys unlike shmcoll's copy of it; sparse all_reduce uses "
                 "torch.sort (slower) to keep Gloo's results")
    return same


def _flattened(indices: torch.Tensor, shape) -> torch.Tensor:
    """The row-major position of each index tuple among the sparse dimensions (torch's flatten_indices)."""
    if indices.shape[0] == 1:
        return indices[0]
    strides = [1] * indices.shape[0]
    for d in range(indices.shape[0] - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    return (indices * torch.tensor(strides, dtype=torch.int64)[:, None]).sum(0)


def _merged(placement, all_indices: torch.Tensor, values: torch.Tensor, counts: list, shape, kernel: int,
            buffers: Buffers) -> torch.Tensor:
    """The coalesced sum of the parts, in new tensors: ``shmcoll._merge``'s plan over the gathered indices,
    then its merge, fed every rank's ``values`` as the all-gather brings them (``allgather_windows``:
    read in place in shared memory, a slot at a time, on one node)."""
    size, most, sparse_dim = all_indices.shape
    dense_shape = tuple(values.shape[1:])
    row_elems = math.prod(dense_shape)
    row_bytes = row_elems * values.element_size()
    rows = torch.tensor(counts, dtype=torch.int64)
    steps = buffers.rows("steps", sum(counts), (), torch.int32)
    scratch = buffers.rows("plan", 2 * steps.numel(), (), torch.int64)
    nnz = _merge.plan(all_indices.data_ptr(), rows.data_ptr(), size, most, sparse_dim, steps.data_ptr(),
                      scratch.data_ptr())
    sum_indices = torch.empty((sparse_dim, nnz), dtype=torch.int64)
    sum_values = buffers.result(nnz * row_bytes).view(values.dtype).view(nnz, *dense_shape)
    # The rows a window's steps do not reach before it goes wait here, at their place among all parts' rows.
    stash = buffers.rows("all_values", size * most, dense_shape, values.dtype)
    merge = _merge.Merge(steps.data_ptr(), steps.numel(), all_indices.data_ptr(), rows.data_ptr(), size, most,
                         sparse_dim, row_elems, row_bytes, sum_indices.data_ptr(), sum_values.data_ptr(), nnz, kernel,
                         kernel_abi.SUM, stash.data_ptr())
    if most * row_bytes == 0:  # no value bytes to gather (on every rank: they agreed on most and the shape)
        merge.window(0, most, [0] * size)
    else:
        desc = descriptors.descriptor(descriptors.ALLGATHER, *ops.movement(values))
        placement.allgather_windows(values, row_bytes, lambda start, n, at: merge.window(
            start // row_bytes, (start + n) // row_bytes, at), desc)
    merge.finish()
    return torch.sparse_coo_tensor(sum_indices, sum_values, shape, is_coalesced=True, check_invariants=False)


def _added(all_indices: torch.Tensor, all_values: torch.Tensor, counts: list, shape):
    """Gloo's own code for the dtypes without a kernel: the parts added one by one, in rank order, so
    the same result, or the same error where torch's sparse addition has no such dtype (bool)."""
    def part(r):
        return torch.sparse_coo_tensor(all_indices[r, :counts[r]].t(), all_values[r, :counts[r]], shape,
                                       check_invariants=False)

    result = part(0)
    for r in range(1, len(counts)):
        result += part(r)
    return result.coalesce()


def _gather(placement, part: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    """Every rank's ``part`` into ``whole``, in rank order (one all-gather of the placement)."""
    placement.allgather_into(whole, part, descriptors.descriptor(descriptors.ALLGATHER, *ops.movement(part)))
    return whole


def _check_agreement(headers: list, local: torch.Tensor, rank: int) -> None:
    """Every rank sees every header, so all raise the same error together, none waits."""
    differ = [r for r, header in enumerate(headers) if header[1:] != headers[rank][1:]]
    if differ:
        other = headers[differ[0]]
        shape = tuple(other[4:4 + other[3]])
        raise ValueError(f"all_reduce of sparse tensors: rank {rank} has shape {tuple(local.shape)} with "
                         f"{local.sparse_dim()} sparse dimension(s) but rank(s) {', '.join(map(str, differ))} "
                         f"differ (rank {differ[0]}: shape {shape}, {other[1]} sparse dimension(s))")
