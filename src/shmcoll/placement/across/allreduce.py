"""all_reduce across nodes: between the leaders (small messages, or nodes of unequal size), or on every rail.

By the leaders: the node's partial on local rank 0 (one step of the arena for a
small message), one exchange between the leaders (each sends its partial to the
others and combines all of them in node order, so every leader holds the same
bits), the node's copy back from local rank 0. One network round, which is all
a small all_reduce can afford; Gloo's own all_reduce takes two (ring) or more.

On the rails (Horovod's hierarchical all-reduce, pipelined as coll/han does):
per segment, a node reduce-scatter gives local rank l the node's partial of the
l-th shard, rail l all-reduces it between the nodes (all rails at once, each
rank sending 1/L of the message: between two nodes one exchange of the shards,
between more a reduce-scatter and an all-gather of their pieces, combined in
node order: ``partials``), and a node all-gather puts the shards together; the
node stages of one segment run while Gloo carries another.
"""
from __future__ import annotations

import torch

from shmcoll import ops
from shmcoll.placement.across import partials, pipeline, stages
from shmcoll.placement.across.barrier import barrier
from shmcoll.placement.across.network import EXCHANGE_NODES
from shmcoll.staging import staged, unstage


def allreduce(shape, links, tensor: torch.Tensor, red: ops.Reduction, desc: int) -> None:
    values = red.view(tensor)
    if values.numel() == 0:  # still a collective, as on one node: the ranks meet
        return barrier(shape, links, desc)
    work = staged(values)
    flat = work.view(-1)
    if shape.reduces_small(flat.nbytes):
        by_leaders(shape, links, flat, red, desc)
    else:
        on_rails(shape, links, flat, red, desc)
    unstage(values, work)


def by_leaders(shape, links, flat: torch.Tensor, red: ops.Reduction, desc: int) -> None:
    """``flat``: contiguous, 1-D."""
    stages.reduce(shape, flat, red, 0, desc)
    if shape.local_rank == 0:
        between_leaders(shape, links, flat, red)
        red.average(flat)
    stages.broadcast(shape, flat.data_ptr(), flat.nbytes, 0, desc)


def between_leaders(shape, links, work: torch.Tensor, red: ops.Reduction) -> None:
    """``work``: this node's partial on its leader -> the group's result (before AVG's division). A small
    message crosses in one round between up to EXCHANGE_NODES nodes, a large one in two
    (``partials``) on rail 0, which joins the same ranks."""
    small = shape.small(work.nbytes)
    link = links.leaders if small else links.rail
    nodes = len(link.ranks)
    link.wait(partials.allreduce(link, work, red, one_round=nodes == 2 or (small and nodes <= EXCHANGE_NODES)))


def on_rails(shape, links, flat: torch.Tensor, red: ops.Reduction, desc: int) -> None:
    """``flat``: contiguous, 1-D."""
    count, itemsize, L = flat.numel(), flat.element_size(), shape.local_size
    block = -(-count // L)  # elements of each local rank's shard
    if block * L == count:
        work = flat
    else:
        work = torch.zeros(block * L, dtype=flat.dtype)
        work[:count].copy_(flat)
    base, link = work.data_ptr(), links.rail
    # Between two nodes the rail's all-reduce is one exchange of the shards, combined here in node order
    # (so both ranks get the same bits): one network round, where Gloo's ring takes two for the same
    # bytes (1 MiB: 8.9 against 9.4 ms on the shaped link, 2.4 against 2.9 ms unshaped; BENCHMARKS.md).
    one_round = len(link.ranks) == 2
    shard = torch.empty(block, dtype=flat.dtype)  # this rank's shard: its node's partial, then the result

    def node_reduce_scatter(cut):
        lo, hi = cut
        stages.reduce_scatter(shape, work[lo:], hi - lo, block, red, shard[lo:hi], desc)

    def rail_allreduce(cut):
        lo, hi = cut
        return partials.allreduce(link, shard[lo:hi], red, one_round)

    def node_allgather(cut):
        lo, hi = cut
        red.average(shard[lo:hi])
        stages.allgather(shape, shard[lo:hi].data_ptr(), (hi - lo) * itemsize, base + lo * itemsize,
                         block * itemsize, desc)

    per_segment = max(1, shape.segment_bytes // (L * itemsize))
    pipeline.run(link, pipeline.segments(block, per_segment), node_reduce_scatter, rail_allreduce, node_allgather)
    if work is not flat:
        flat.copy_(work[:count])
