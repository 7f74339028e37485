"""A group across nodes as its plans see it, decided once when the group is made."""
from __future__ import annotations

import torch.distributed as dist

from shmcoll.algorithms.allreduce import one_shot_limit
from shmcoll.placement.across.network import Link
from shmcoll.placement.flat import PLAN_TAG

class Shape:
    """Nodes, this rank's place among them, its rail, and the tables the plans index.

    Terms: *node* (the group ranks that share a host identity, nodes ordered by their lowest rank,
    a node's ranks by rank; N nodes), *local rank* (a rank's position in its node), *rail* (local
    rank i of every node that has one: a Gloo group; all rails run at once), *leaders* (the nodes'
    local rank 0, which every node has: rail 0, and a Gloo group of their own for small messages).
    """

    def __init__(self, store, rank: int, size: int, timeout, topo, arena, keys: str, settings):
        self.rank, self.size = rank, size
        self.nodes = topo.nodes
        self.node = topo.node
        self.local_ranks = topo.local_ranks
        self.local_rank = self.local_ranks.index(rank)
        self.local_size = len(self.local_ranks)
        self.arena = arena  # this node's arena; None when this rank is alone on its node
        # Plans that need every node to hold the same number of ranks (the rails then carry equal shares).
        self.uniform = len({len(ranks) for ranks in self.nodes}) == 1
        # All-reduces up to this size cross between the leaders in one exchange; larger ones on every rail.
        self.small_bytes = settings.small_bytes
        self.one_shot_bytes = one_shot_limit(settings.small_bytes, settings.chunk_bytes, self.local_size)  # node stage
        self.segment_bytes = settings.segment_bytes  # of a message, per pipeline segment (``pipeline``)
        self.alltoall_room = None  # on a leader: bytes per rank its all_to_all headers carry (``alltoall``)
        # all_to_all's sizes as last agreed (``alltoall``): this rank's (send sizes, then receive sizes); on
        # a leader the group's table; and whether that call was large with its predecessor's sizes on every
        # rank, so that the next one moves its blocks at once, taking the sizes to be the same again.
        self.alltoall_row = None
        self.alltoall_table = None
        self.alltoall_repeat = False
        # stride[n]: the group ranks of node n are nodes[n][0] + l * stride[n] (None: no such stride), so that
        # a node stage writes local rank l's block of a rank-ordered output with one strided schedule.
        self.stride = [_stride(ranks) for ranks in self.nodes]
        self.where = {r: (n, l) for n, ranks in enumerate(self.nodes) for l, r in enumerate(ranks)}
        self.remote = [r for r in range(size) if self.where[r][0] != self.node]  # the ranks on other nodes
        self.other_nodes = [n for n in range(len(self.nodes)) if n != self.node]
        # rail_nodes[i]: the nodes on rail i, in node order (a node's position on the rail is its index there).
        self.rail_nodes = [[n for n, ranks in enumerate(self.nodes) if len(ranks) > i]
                           for i in range(max(len(ranks) for ranks in self.nodes))]
        # A Gloo group over all ranks, for direct messages between any two ranks (and ``placement.flat``).
        self.pairs = Link(rank, self.node, dist.ProcessGroupGloo(dist.PrefixStore(f"{keys}/flat", store), rank, size,
                                                                 timeout), "the group of all ranks",
                          list(range(size)), rank, tag=PLAN_TAG)
        members = self.rail_nodes[self.local_rank]
        self.rail = None  # this rank's Link to its rail, if another node is on it
        self.leaders = None  # on a leader: its Link to the other leaders, for the plans' small messages
        if len(members) > 1:
            def link(name: str, key: str) -> Link:
                group = dist.ProcessGroupGloo(dist.PrefixStore(f"{keys}/{key}", store), members.index(self.node),
                                              len(members), timeout)
                return Link(rank, self.node, group, name, [self.nodes[n][self.local_rank] for n in members],
                            members.index(self.node))

            self.rail = link(f"rail {self.local_rank}", f"rail/{self.local_rank}")
            # The leaders' small messages (headers, partials, the small collectives' data) on connections
            # of their own, never the bulk's: TCP paces a connection at the rate its bulk reached (BBR), and
            # where the cores were the limit that held a 64 KiB all_to_all to 1.4-1.6 ms after large
            # collectives, against 0.8 ms on a connection of its own (BENCHMARKS.md).
            if self.local_rank == 0:
                self.leaders = link("the leaders' link", "leaders")
        self.links = [x for x in (self.rail, self.leaders) if x is not None]  # ours, besides ``pairs``

    def rank_of(self, node: int, local_rank: int) -> int:
        return self.nodes[node][local_rank]

    def node_of(self, rank: int) -> tuple[int, int]:
        """(node, local rank) of a group rank."""
        return self.where[rank]


def _stride(ranks: list[int]) -> int | None:
    if len(ranks) == 1:
        return 1
    step = ranks[1] - ranks[0]
    return step if all(b - a == step for a, b in zip(ranks, ranks[1:])) else None
