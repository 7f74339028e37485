"""reduce_scatter_tensor across nodes: each node's partial of a block crosses the network once.

A small input (up to SHMCOLL_SMALL_BYTES) goes through the leaders: the node's
partial of the whole input on its leader, one message between each pair of
leaders (the partial of the other node's blocks), the combined blocks
scattered in the node; only the leaders touch the network.

A larger one, per segment of the blocks: for each node n, a node reduce-scatter gives local
rank l this node's partial of block (n, l), the block of its rail peer on node
n; rail l then exchanges those partials (an all_to_all: each rank sends N - 1
partials and receives the N - 1 partials of its own block, 1/N of the input
per other node, the least it can) and each rank combines the N partials of its
block in node order. Gloo's own reduce-scatter between two ranks sends the
whole input, twice what is needed.
"""
from __future__ import annotations

import torch

from shmcoll import ops
from shmcoll.placement.across import partials, pipeline, stages
from shmcoll.placement.across.barrier import barrier
from shmcoll.placement.across.network import EXCHANGE_NODES


def reduce_scatter(shape, links, output: torch.Tensor, input: torch.Tensor, red: ops.Reduction, desc: int) -> None:
    """Nodes of equal size; ``input``: contiguous, every rank's block for ``output`` in rank order."""
    out, source = red.view(output), red.view(input).reshape(-1)
    M = out.numel()
    if M == 0:  # still a collective, as on one node: the ranks meet
        return barrier(shape, links, desc)
    N, itemsize, link = len(shape.nodes), source.element_size(), links.rail
    if shape.small(source.numel() * itemsize):
        return _by_leaders(shape, links, out, source, red, desc)
    result = out if out.is_contiguous() else torch.empty(M, dtype=out.dtype)
    flat_result = result.view(-1)
    in_flight = {}  # cut -> (partials we send, partials of our block we receive), one row per node

    def node_reduce_scatter(cut):
        lo, hi = cut
        mine = torch.empty((N, hi - lo), dtype=source.dtype)
        for n, ranks in enumerate(shape.nodes):
            stride = shape.stride[n]
            if stride is not None:
                stages.reduce_scatter(shape, source[ranks[0] * M + lo:], hi - lo, stride * M, red, mine[n], desc)
            else:  # ranks not evenly spaced: their blocks side by side first
                blocks = torch.stack([source[r * M + lo:r * M + hi] for r in ranks])
                stages.reduce_scatter(shape, blocks.view(-1), hi - lo, hi - lo, red, mine[n], desc)
        in_flight[cut] = (mine, torch.empty_like(mine))

    def rail_exchange(cut):
        mine, theirs = in_flight[cut]
        if N > EXCHANGE_NODES:
            return link.alltoall(theirs, mine, [1] * N, [1] * N)
        theirs[shape.node].copy_(mine[shape.node])
        return link.swap({m: mine[m] for m in shape.other_nodes}, {m: theirs[m] for m in shape.other_nodes})

    def combine(cut):
        lo, hi = cut
        _, theirs = in_flight.pop(cut)
        partials.combine(red, flat_result[lo:hi], theirs)
        red.average(flat_result[lo:hi])

    per_segment = max(1, shape.segment_bytes // (shape.size * itemsize))
    pipeline.run(link, pipeline.segments(M, per_segment), node_reduce_scatter, rail_exchange, combine)
    if result is not out:
        out.copy_(result.view_as(out))


def _by_leaders(shape, links, out: torch.Tensor, source: torch.Tensor, red: ops.Reduction, desc: int) -> None:
    M, N, L = out.numel(), len(shape.nodes), shape.local_size
    work = source.clone()  # the node stage reduces in place; the caller's input stays as it was
    stages.reduce(shape, work, red, 0, desc)
    ours = torch.empty(L * M, dtype=work.dtype)  # on the leader: this node's blocks, combined over every node
    if shape.local_rank == 0:
        blocks = work.view(shape.size, M)
        parts = torch.empty((N, L * M), dtype=work.dtype)  # each node's partial of this node's blocks
        parts[shape.node].copy_(blocks[shape.local_ranks].view(-1))
        others = shape.other_nodes
        links.leaders.wait(links.leaders.swap({m: blocks[shape.nodes[m]].reshape(-1) for m in others},
                                              {m: parts[m] for m in others}))
        partials.combine(red, ours, parts)
    result = out if out.is_contiguous() else torch.empty(M, dtype=out.dtype)
    itemsize = work.element_size()
    stages.scatter(shape, [ours.data_ptr() + l * M * itemsize for l in range(L)], M * itemsize, 0,
                   result.data_ptr(), desc)
    red.average(result)
    if result is not out:
        out.copy_(result.view_as(out))
