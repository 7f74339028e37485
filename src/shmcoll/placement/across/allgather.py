"""all_gather_into_tensor across nodes: each rank's block crosses the network once per other node.

A small output (up to SHMCOLL_SMALL_BYTES) goes through the leaders: the node's
blocks gathered on its leader, one message between each pair of leaders, the
whole output broadcast in the node; only the leaders touch the network.

A larger one, per segment of the blocks: rail l all-gathers local rank l's block between the
nodes (so a node sends its L blocks once, 1/N of the output per other node,
the least it can), while the node all-gathers its own ranks' blocks in shared
memory; once the rail's segment is in, the node all-gathers what each rank
received, node by node. Every block lands at its rank's place in the output,
with a strided schedule where a node's ranks are evenly spaced (contiguous or
interleaved ranks), else with one address per rank.
"""
from __future__ import annotations

import torch

from shmcoll.placement.across import pipeline, stages
from shmcoll.staging import staged_empty, unstage


def allgather_into(shape, output: torch.Tensor, input: torch.Tensor, desc: int) -> None:
    """Nodes of equal size; ``output`` holds every rank's ``input`` in rank order."""
    source = input.contiguous().reshape(-1).view(torch.uint8)
    nbytes = source.numel()
    if nbytes == 0:
        return
    target = staged_empty(output)
    out = target.reshape(-1).view(torch.uint8)
    if out.numel() <= shape.small_bytes:
        _by_leaders(shape, out, source, desc)
        return unstage(output, target)
    base, link, me = out.data_ptr(), shape.rail, shape.local_rank
    nodes = range(len(shape.nodes))
    own = torch.empty(min(nbytes, shape.segment_bytes), dtype=torch.uint8)  # Gloo's copy of our own block

    def node_stage(node: int, addr: int, lo: int, n: int) -> None:
        """Every local rank l's ``n`` bytes at ``addr`` to byte ``lo`` of rank (``node``, l)'s block."""
        ranks, stride = shape.nodes[node], shape.stride[node]
        if stride is not None:
            stages.allgather(shape, addr, n, base + ranks[0] * nbytes + lo, stride * nbytes, desc)
        else:
            stages.allgather_to(shape, addr, n, [base + r * nbytes + lo for r in ranks], desc)

    def own_node(cut):
        lo, hi = cut
        node_stage(shape.node, source.data_ptr() + lo, lo, hi - lo)

    def rail(cut):
        lo, hi = cut
        blocks = [own[:hi - lo] if n == shape.node else out[shape.rank_of(n, me) * nbytes + lo:][:hi - lo]
                  for n in nodes]
        return link.allgather(blocks, source[lo:hi])

    def other_nodes(cut):
        lo, hi = cut
        for n in nodes:
            if n != shape.node:
                node_stage(n, base + shape.rank_of(n, me) * nbytes + lo, lo, hi - lo)

    per_segment = max(1, shape.segment_bytes // shape.size)
    pipeline.run(link, pipeline.segments(nbytes, per_segment), own_node, rail, other_nodes)
    unstage(output, target)


def _by_leaders(shape, out: torch.Tensor, source: torch.Tensor, desc: int) -> None:
    nbytes, base = source.numel(), out.data_ptr()
    blocks = out.view(shape.size, nbytes)
    ours = shape.local_ranks
    stages.gather(shape, source.data_ptr(), nbytes, 0, [base + r * nbytes for r in ours], desc)
    if shape.local_rank == 0:
        others = [m for m in range(len(shape.nodes)) if m != shape.node]
        inbound = {m: torch.empty((len(shape.nodes[m]), nbytes), dtype=torch.uint8) for m in others}
        shape.rail.exchange(blocks[ours], inbound)
        for m in others:
            blocks[shape.nodes[m]] = inbound[m]
    stages.broadcast(shape, base, out.numel(), 0, desc)
