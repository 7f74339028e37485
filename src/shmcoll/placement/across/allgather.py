"""all_gather_into_tensor across nodes: each rank's block crosses the network once per other node.

A small output (up to SHMCOLL_SMALL_BYTES) goes through the leaders: the node's
blocks gathered on its leader, one message between each pair of leaders, the
whole output broadcast in the node; only the leaders touch the network.

A larger one, per segment of the blocks: rail l all-gathers local rank l's block between the
nodes (so a node sends its L blocks once, 1/N of the output per other node,
the least it can; up to EXCHANGE_NODES nodes as direct messages into their
places, one round), while the node all-gathers its own ranks' blocks in shared
memory; once the rail's segment is in, the node all-gathers what each rank
received, node by node. Every block lands at its rank's place in the output,
with a strided schedule where a node's ranks are evenly spaced (contiguous or
interleaved ranks), else with one address per rank.
"""
from __future__ import annotations

import torch

from shmcoll.placement.across import pipeline, stages
from shmcoll.placement.across.barrier import barrier
from shmcoll.placement.across.network import EXCHANGE_NODES
from shmcoll.staging import flat_bytes, staged_empty, unstage


def allgather_into(shape, links, output: torch.Tensor, input: torch.Tensor, desc: int) -> None:
    """Nodes of equal size; ``output`` holds every rank's ``input`` in rank order."""
    target = staged_empty(output)
    out = flat_bytes(target)
    nbytes = input.nbytes
    allgather(shape, links, [out[r * nbytes:(r + 1) * nbytes] for r in range(shape.size)], input, desc)
    unstage(output, target)


def allgather(shape, links, outs: list[torch.Tensor], input: torch.Tensor, desc: int) -> None:
    """Nodes of equal size; ``outs[r]``: a contiguous uint8 view that receives rank r's ``input``."""
    source = flat_bytes(input.contiguous())
    nbytes = source.numel()
    if nbytes == 0:  # still a collective, as on one node: the ranks meet
        return barrier(shape, links, desc)
    if shape.small(nbytes * shape.size):
        return _by_leaders(shape, links, outs, source, desc)
    link, me = links.rail, shape.local_rank
    addresses = [t.data_ptr() for t in outs]
    nodes = range(len(shape.nodes))
    # Up to EXCHANGE_NODES nodes each member sends its segment to every other one (the bytes of Gloo's ring,
    # in one round); beyond, Gloo's all_gather, which wants room for its copy of our own segment.
    direct = len(link.ranks) <= EXCHANGE_NODES
    own = None if direct else torch.empty(min(nbytes, shape.segment_bytes), dtype=torch.uint8)

    def node_stage(node: int, addr: int, lo: int, n: int) -> None:
        """Every local rank l's ``n`` bytes at ``addr`` to byte ``lo`` of rank (``node``, l)'s block."""
        at = [addresses[r] + lo for r in shape.nodes[node]]
        stride = at[1] - at[0] if len(at) > 1 else 0
        if all(b - a == stride for a, b in zip(at, at[1:])):
            stages.allgather(shape, addr, n, at[0], stride, desc)
        else:
            stages.allgather_to(shape, addr, n, at, desc)

    def own_node(cut):
        lo, hi = cut
        node_stage(shape.node, source.data_ptr() + lo, lo, hi - lo)

    def rail(cut):
        lo, hi = cut
        if direct:  # each member's segment straight into its place, no copy of our own
            theirs = {m: outs[r][lo:hi] for m, r in enumerate(link.ranks) if m != link.position}
            return link.swap({m: source[lo:hi] for m in theirs}, theirs)
        blocks = [own[:hi - lo] if n == shape.node else outs[shape.rank_of(n, me)][lo:hi] for n in nodes]
        return link.allgather(blocks, source[lo:hi])

    def other_nodes(cut):
        lo, hi = cut
        for n in shape.other_nodes:
            node_stage(n, addresses[shape.rank_of(n, me)] + lo, lo, hi - lo)

    per_segment = max(1, shape.segment_bytes // shape.size)
    pipeline.run(link, pipeline.segments(nbytes, per_segment), own_node, rail, other_nodes)


def _by_leaders(shape, links, outs: list[torch.Tensor], source: torch.Tensor, desc: int) -> None:
    """The node's blocks gathered on its leader, one exchange between the leaders, the node's broadcast."""
    nbytes = source.numel()
    whole = torch.empty((shape.size, nbytes), dtype=torch.uint8)  # small: one copy out at the end
    ours = shape.local_ranks
    stages.gather(shape, source.data_ptr(), nbytes, 0, [whole[r].data_ptr() for r in ours], desc)
    if shape.local_rank == 0:
        inbound = {m: torch.empty((len(shape.nodes[m]), nbytes), dtype=torch.uint8) for m in shape.other_nodes}
        links.leaders.exchange(whole[ours], inbound)
        for m in shape.other_nodes:
            whole[shape.nodes[m]] = inbound[m]
    stages.broadcast(shape, whole.data_ptr(), whole.numel(), 0, desc)
    for out, part in zip(outs, whole):
        out.copy_(part)
