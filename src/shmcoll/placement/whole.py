"""``allgather_windows`` for placements without shared slots to read in place: the whole gathered first."""
from __future__ import annotations

import torch


def allgather_whole(placement, size: int, input: torch.Tensor, consume, desc: int) -> None:
    """Every rank's ``input`` gathered into private memory (``placement.allgather_into``), then handed to
    ``consume`` as one window."""
    source = input.contiguous().view(-1)
    nbytes = source.nbytes
    whole = torch.empty(size * source.numel(), dtype=source.dtype)
    placement.allgather_into(whole, source, desc)
    consume(0, nbytes, [whole.data_ptr() + r * nbytes for r in range(size)])
