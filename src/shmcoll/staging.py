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


def shows_other_values(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory holds other values than torch shows: a lazily negated or conjugated view (the
    neg or conj bit: ``torch._neg_view``, ``x.conj()``, ``x.conj().imag``), whose every read and write torch
    negates or conjugates on the way."""
    return tensor.is_neg() or tensor.is_conj()


def resolved(args, written: int | None):
    """A call's arguments (tensors, and lists or tuples of them, nested) with every tensor that
    ``shows_other_values`` replaced by a copy that holds its values as torch shows them; None where there is no
    such tensor. Returns (arguments, write_back): ``write_back`` the (tensor, stand-in) pairs of the argument at
    index ``written`` (the call's outputs, in place or not; None: it writes none), whose stand-ins the call
    fills and the caller copies back (``tensor.copy_(stand_in)``, which negates or conjugates on the way)."""
    found = []

    def walk(arg, index):
        if isinstance(arg, torch.Tensor):
            if not shows_other_values(arg):
                return arg
            stand_in = arg.resolve_conj().resolve_neg()
            if index == written:
                found.append((arg, stand_in))
            found.append(None)  # a stand-in was made
            return stand_in
        if isinstance(arg, (list, tuple)):
            return type(arg)(walk(item, index) for item in arg)
        return arg

    new = tuple(walk(arg, index) for index, arg in enumerate(args))
    if not found:
        return None
    return new, [pair for pair in found if pair is not None]
