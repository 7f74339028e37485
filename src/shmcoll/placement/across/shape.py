"""A group across nodes as its plans see it, decided once when the group is made: where every rank is.

The Gloo groups that join the nodes are ``links.Links``; what all_to_all remembers between calls is
``alltoall.Agreed``.
"""
from __future__ import annotations

from shmcoll.algorithms.allreduce import one_shot_limit


class Shape:
    """Nodes, this rank's place among them, its rail, and the tables the plans index.

    Terms: *node* (the group ranks that share a host identity, nodes ordered by their lowest rank,
    a node's ranks by rank; N nodes), *local rank* (a rank's position in its node), *rail* (local
    rank i of every node that has one: a Gloo group; all rails run at once), *leaders* (the nodes'
    local rank 0, which every node has: rail 0, and a Gloo group of their own for small messages).
    """

    def __init__(self, rank: int, size: int, topo, arena, lanes, settings):
        self.rank, self.size = rank, size
        self.nodes = topo.nodes
        self.node = topo.node
        self.local_ranks = topo.local_ranks
        self.local_rank = self.local_ranks.index(rank)
        self.local_size = len(self.local_ranks)
        self.arena = arena  # this node's arena; None when this rank is alone on its node
        self.lanes = lanes  # the arena's lanes (shmcoll.lanes.Lanes), which the node stages split over; None alike
        # Plans that need every node to hold the same number of ranks (the rails then carry equal shares).
        self.uniform = len({len(ranks) for ranks in self.nodes}) == 1
        self.small_bytes = settings.small_bytes  # ``small``
        self.one_shot_bytes = one_shot_limit(settings.small_bytes, settings.chunk_bytes, self.local_size)  # node stage
        self.segment_bytes = settings.segment_bytes  # of a message, per pipeline segment (``pipeline``)
        # stride[n]: the group ranks of node n are nodes[n][0] + l * stride[n] (None: no such stride), so that
        # a node stage writes local rank l's block of a rank-ordered output with one strided schedule.
        self.stride = [_stride(ranks) for ranks in self.nodes]
        self.where = {r: (n, l) for n, ranks in enumerate(self.nodes) for l, r in enumerate(ranks)}
        self.remote = [r for r in range(size) if self.where[r][0] != self.node]  # the ranks on other nodes
        self.other_nodes = [n for n in range(len(self.nodes)) if n != self.node]
        # rail_nodes[i]: the nodes on rail i, in node order (a node's position on the rail is its index there).
        self.rail_nodes = [[n for n, ranks in enumerate(self.nodes) if len(ranks) > i]
                           for i in range(max(len(ranks) for ranks in self.nodes))]

    def small(self, message_bytes: int) -> bool:
        """Whether a collective takes its small plan, which crosses between the nodes in the fewest rounds
        (through the leaders, or on one rank per node): its whole message, the largest buffer any rank
        passes (an all_gather's or gather's output, a reduce_scatter's input, the sends or the receives of
        an all_to_all, the tensor of the others), is at most SHMCOLL_SMALL_BYTES."""
        return message_bytes <= self.small_bytes

    def reduces_small(self, message_bytes: int) -> bool:
        """Whether all_reduce and reduce take their small plan: a small message, or nodes of unequal size
        (they have no rails that carry equal shares)."""
        return not self.uniform or self.small(message_bytes)

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
