"""The argument checks of every collective and the error texts they raise.

A check that fails raises before any rank communicates, naming the collective,
the argument and (where it depends on the rank) this rank, so that a bad call
never leaves the others waiting on data that will not come.
"""
from __future__ import annotations

import torch

_STRIDED = torch.strided


def not_cpu(what: str, device) -> ValueError:
    """The error for a tensor on another device than the CPU.

    It names a group of the device's own backend, not ``init_process_group("cpu:shm,cuda:nccl")``:
    from such a list torch keeps the first creator's result that is a whole ProcessGroup, as shm's
    is, and registers no NCCL beneath it (seen on torch 2.11 with NCCL and 2.13), so that line would
    give a group on which CUDA tensors fail the same way.
    """
    return ValueError(f"{what}: the shm backend handles CPU tensors only, got a tensor on {device}; pass "
                      f"such tensors to a group of a backend for that device, e.g. "
                      f"torch.distributed.new_group(backend='nccl')")


def tensor(t, what: str) -> torch.Tensor:
    """``t`` if it is a dense CPU tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu:
        raise not_cpu(what, t.device)
    if t.layout is not _STRIDED:
        raise ValueError(f"{what}: the shm backend handles dense tensors here, got layout {t.layout}")
    return t


def one_tensor(tensors, what: str) -> torch.Tensor:
    """The single dense CPU tensor of a one-tensor-per-rank call (a list of one, or the tensor)."""
    if isinstance(tensors, torch.Tensor):
        return tensor(tensors, what)
    if len(tensors) != 1:
        raise ValueError(f"{what}: the shm backend takes exactly one tensor per call, got {len(tensors)}")
    return tensor(tensors[0], what)


def root(rank: int, size: int, what: str) -> int:
    if not 0 <= rank < size:
        raise ValueError(f"{what}: root rank {rank} is not in this group of {size} ranks")
    return rank


def peer(rank: int, me: int, size: int, what: str) -> int:
    if not 0 <= rank < size:
        raise ValueError(f"{what}: rank {rank} is not in this group of {size} ranks")
    if rank == me:
        raise ValueError(f"{what}: rank {rank} cannot exchange a message with itself")
    return rank


def list_of_size(tensors, size: int, what: str) -> list:
    if len(tensors) != size:
        raise ValueError(f"{what} has {len(tensors)} tensors; the group has {size} ranks")
    return list(tensors)


def rooted(opts, lists, model: torch.Tensor, size: int, rank: int, op: str, role: str):
    """(root, the root's tensor list or None on other ranks) of gather's outputs or scatter's inputs."""
    root_rank = root(opts.rootRank if opts is not None else 0, size, op)
    return root_rank, rooted_list(lists, rank == root_rank, model, size, root_rank, rank, f"{op} {role}")


def _one_list(lists, size: int, what: str) -> list:
    """The tensor list of a c10d list-of-lists argument (one list per device: a CPU group takes one), with
    one tensor per rank."""
    if len(lists) != 1:
        raise ValueError(f"{what}: expected one list, got {len(lists)}")
    return list_of_size(lists[0], size, f"{what} list")


def one_list_like(lists, size: int, model: torch.Tensor, what: str) -> list:
    """``_one_list``, each tensor like ``model``."""
    tensors = _one_list(lists, size, what)
    like(tensors, model, what)
    return tensors


def blocks(lists, size: int, output: torch.Tensor, rank: int, what: str) -> list:
    """The input list of reduce_scatter's list form: one dense CPU tensor per rank of ``output``'s dtype, this
    rank's block as long as ``output``. The blocks may differ in size, as torch (and Gloo, and NCCL) allow: rank
    r's output is as long as every rank's block r, which the collective's descriptors check between ranks."""
    tensors = _one_list(lists, size, what)
    for i, t in enumerate(tensors):
        tensor(t, f"{what}[{i}]")
        if t.dtype != output.dtype:
            raise ValueError(f"{what}[{i}] is {t.dtype}; the output is {output.dtype}")
    if tensors[rank].numel() != output.numel():
        raise ValueError(f"{what}[{rank}] has {tensors[rank].numel()} elements, this rank's output "
                         f"{output.numel()}: rank r's output is as long as block r of every rank's input")
    return tensors


def like(tensors, model: torch.Tensor, what: str) -> None:
    """Every tensor of ``tensors`` is a dense CPU tensor of ``model``'s dtype and element count."""
    for i, t in enumerate(tensors):
        tensor(t, f"{what}[{i}]")
        if t.dtype != model.dtype or t.numel() != model.numel():
            raise ValueError(f"{what}[{i}] is {t.dtype} with {t.numel()} elements; expected {model.dtype} "
                             f"with {model.numel()} elements")


def same_dtype(tensors, what: str) -> None:
    for i, t in enumerate(tensors):
        tensor(t, f"{what}[{i}]")
        if t.dtype != tensors[0].dtype:
            raise ValueError(f"{what}: tensor {i} is {t.dtype}, tensor 0 is {tensors[0].dtype}")


def pairs(outputs, inputs, what: str) -> None:
    """A coalesced call: as many outputs as inputs."""
    if len(outputs) != len(inputs):
        raise ValueError(f"{what}: {len(outputs)} outputs for {len(inputs)} inputs")


def gathered(whole: torch.Tensor, part: torch.Tensor, size: int, what: str, whole_name: str,
             part_name: str) -> None:
    """``whole`` holds ``size`` times ``part``'s elements (all_gather_into_tensor, reduce_scatter_tensor)."""
    tensor(part, f"{what} {part_name}")
    tensor(whole, f"{what} {whole_name}")
    if whole.dtype != part.dtype or whole.numel() != part.numel() * size:
        raise ValueError(f"{what}: {whole_name} must be {part.dtype} with {part.numel() * size} elements "
                         f"({part_name} x {size} ranks), got {whole.dtype} with {whole.numel()}")


def rooted_list(lists, is_root: bool, model: torch.Tensor, size: int, root_rank: int, me: int,
                what: str) -> list | None:
    """The root's list of ``size`` tensors like ``model`` (gather's outputs, scatter's inputs); None elsewhere."""
    if is_root:
        if len(lists) != 1:
            raise ValueError(f"{what}: the root expects one list of tensors, got {len(lists)}")
        items = list_of_size(lists[0], size, f"{what} list")
        like(items, model, what)
        return items
    if lists and any(len(items) for items in lists):
        raise ValueError(f"{what}: only the root (rank {root_rank}) takes a list of tensors; rank {me} got one")
    return None


def split_bytes(t: torch.Tensor, splits, size: int, what: str) -> list[tuple[int, int]]:
    """(byte offset, byte count) of each rank's block of ``t`` along dim 0 (all_to_all_single)."""
    rows = t.shape[0] if t.dim() else 1
    row_bytes = t.nbytes // rows if rows else 0
    splits = list(splits)
    if not splits:
        if rows % size:
            raise ValueError(f"all_to_all_single: {what} has {rows} rows, not divisible by the {size} ranks; "
                             f"pass split sizes")
        splits = [rows // size] * size
    if len(splits) != size or sum(splits) != rows or min(splits) < 0:
        raise ValueError(f"all_to_all_single: {what} split sizes {splits} must be {size} non-negative numbers "
                         f"summing to its {rows} rows")
    blocks, offset = [], 0
    for n in splits:
        blocks.append((offset, n * row_bytes))
        offset += n * row_bytes
    return blocks


def sparse(t: torch.Tensor, what: str) -> torch.Tensor:
    """A sparse COO CPU tensor (the only sparse layout all_reduce takes, as with Gloo)."""
    if not t.is_cpu:
        raise ValueError(f"{what}: the shm backend handles CPU tensors only, got a sparse tensor on {t.device}")
    if t.layout is not torch.sparse_coo:
        raise ValueError(f"{what}: the shm backend reduces dense tensors and sparse COO tensors, got layout "
                         f"{t.layout}")
    return t
