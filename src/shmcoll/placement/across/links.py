"""The Gloo groups that join a rank to the other nodes, made once when the group is made."""
from __future__ import annotations

import torch.distributed as dist

from shmcoll.placement.across.network import Link
from shmcoll.placement.flat import PLAN_TAG


class Links:
    """This rank's rail (local rank i of every node that has one), on a leader the leaders' link, and a
    group of all ranks for direct messages between any two ranks (and ``placement.flat``)."""

    def __init__(self, store, keys: str, shape, timeout):
        rank, node, local_rank = shape.rank, shape.node, shape.local_rank
        self.pairs = Link(rank, node, dist.ProcessGroupGloo(dist.PrefixStore(f"{keys}/flat", store), rank,
                                                            shape.size, timeout),
                          "the group of all ranks", list(range(shape.size)), rank, tag=PLAN_TAG)
        members = shape.rail_nodes[local_rank]
        self.rail = None  # this rank's Link to its rail, if another node is on it
        self.leaders = None  # on a leader: its Link to the other leaders, for the plans' small messages
        if len(members) > 1:
            def link(name: str, key: str) -> Link:
                group = dist.ProcessGroupGloo(dist.PrefixStore(f"{keys}/{key}", store), members.index(node),
                                              len(members), timeout)
                return Link(rank, node, group, name, [shape.nodes[n][local_rank] for n in members],
                            members.index(node))

            self.rail = link(f"rail {local_rank}", f"rail/{local_rank}")
            # The leaders' small messages (headers, partials, the small collectives' data) on connections
            # of their own, never the bulk's: TCP paces a connection at the rate its bulk reached (BBR), and
            # where the cores were the limit that held a 64 KiB all_to_all to 1.4-1.6 ms after large
            # collectives, against 0.8 ms on a connection of its own (BENCHMARKS.md).
            if local_rank == 0:
                self.leaders = link("the leaders' link", "leaders")

    def close(self) -> None:
        """Stop the Gloo groups' worker threads now (see ``Nodes.close``)."""
        for link in (self.rail, self.leaders, self.pairs):
            if link is not None:
                link.close()

    def drop(self) -> None:
        """Let go of the Gloo groups: the last references, so Gloo closes their connections now."""
        for link in (self.rail, self.leaders, self.pairs):
            if link is not None:
                link.drop()
