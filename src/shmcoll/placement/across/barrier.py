"""barrier across nodes: the node meets, its leader meets the other leaders, the node is released."""
from __future__ import annotations

import torch

from shmcoll.placement.across import stages
from shmcoll.placement.across.network import EXCHANGE_NODES

_TOKEN = torch.zeros(1, dtype=torch.uint8)


def barrier(shape, links, desc: int) -> None:
    stages.barrier(shape, desc)
    if shape.local_rank == 0:
        link = links.leaders
        if len(link.ranks) <= EXCHANGE_NODES:
            # A one-byte exchange is one network round; Gloo's barrier (an all-reduce) takes more.
            link.exchange(_TOKEN, {m: torch.empty(1, dtype=torch.uint8) for m in range(len(link.ranks))
                                   if m != link.position})
        else:
            link.barrier()
    stages.barrier(shape, desc)
