"""Stand-ins for the user's tensors: the algorithms work on raw addresses, so on contiguous tensors whose memory
holds the values torch shows."""
from __future__ import annotations

import torch


def staged(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor with ``tensor``'s values: itself, or a copy to write back after."""
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def staged_empty(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself if contiguous, else a contiguous buffer to fill and copy back."""
    return tensor if tensor.is_contiguous() else torch.empty_like(tensor, memory_format=torch.contiguous_format)


def unstage(tensor: torch.Tensor, staged_tensor: torch.Tensor) -> None:
    """Write a staged result back into ``tensor`` (nothing to do if it was used directly)."""
    if staged_tensor is not tensor:
        tensor.copy_(staged_tensor)


def apart(sources: list[torch.Tensor], targets: list[torch.Tensor]) -> list[torch.Tensor]:
    """``sources`` (contiguous), or copies of them where a target's memory overlaps one: for the paths on which
    peers read this rank's inputs while it writes its outputs (single copy, messages between nodes). (Copies,
    not another path: the path must be the same on every rank, and only this one knows its tensors overlap.)"""
    return [t.clone() if any(_overlap(t, out) for out in targets) else t for t in sources]


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory of two contiguous tensors overlaps."""
    return a.data_ptr() < b.data_ptr() + b.nbytes and b.data_ptr() < a.data_ptr() + a.nbytes


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, as a flat uint8 view. torch calls a tensor of at most one element contiguous
    whatever its stride (``t[::2]`` of two elements has stride 2), and keeps that stride in its flat views,
    which a view as another itemsize refuses: such a one is viewed with stride 1 first."""
    flat = tensor.detach().reshape(-1)
    if flat.stride(0) != 1:
        flat = flat.as_strided((flat.numel(),), (1,))
    return flat.view(torch.uint8)


def shows_other_values(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory holds other values than torch shows: a lazily negated or conjugated view (the
    neg or conj bit: ``torch._neg_view``, ``x.conj()``, ``x.conj().imag``), whose every read and write torch
    negates or conjugates on the way."""
    return tensor.is_neg() or tensor.is_conj()


def _any_shows_other_values(args) -> bool:
    """Whether ``args`` (tensors, and lists or tuples of them, nested) hold a tensor that ``shows_other_values``.

    Asked of every call the general path takes: exact types first, since ``isinstance`` of anything but a tensor
    (the call's options) goes through the tensor metaclass's check (60-75 ns), and one level of lists inline."""
    for arg in args:
        kind = type(arg)
        if kind is torch.Tensor:
            if arg.is_neg() or arg.is_conj():
                return True
        elif kind is list or kind is tuple:
            for item in arg:
                if type(item) is torch.Tensor:
                    if item.is_neg() or item.is_conj():
                        return True
                elif _any_shows_other_values((item,)):
                    return True
        elif isinstance(arg, torch.Tensor) and shows_other_values(arg):
            return True
    return False


def resolved(args, written: int | None):
    """A call's arguments (tensors, and lists or tuples of them, nested) with every tensor that
    ``shows_other_values`` replaced by a copy that holds its values as torch shows them; None where there is no
    such tensor. Returns (arguments, write_back): ``write_back`` the (tensor, stand-in) pairs of the argument at
    index ``written`` (the call's outputs, in place or not; None: it writes none), whose stand-ins the call
    fills and the caller copies back (``tensor.copy_(stand_in)``, which negates or conjugates on the way)."""
    # Every call of the general path asks, and nearly none has such a tensor: a scan that makes nothing first
    # (the rebuild below cost a 1-rank 8-byte dist.all_reduce 2.5 us).
    if not _any_shows_other_values(args):
        return None
    write_back = []

    def walk(arg, index):
        if isinstance(arg, torch.Tensor):
            if not shows_other_values(arg):
                return arg
            stand_in = arg.resolve_conj().resolve_neg()
            if index == written:
                write_back.append((arg, stand_in))
            return stand_in
        if isinstance(arg, (list, tuple)):
            return type(arg)(walk(item, index) for item in arg)
        return arg

    return tuple(walk(arg, index) for index, arg in enumerate(args)), write_back
