"""Contiguous stand-ins for the user's tensors: the algorithms work on raw addresses."""
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
