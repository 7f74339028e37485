"""all_reduce across nodes: between the leaders (small messages, or nodes of unequal size), or on every rail.

By the leaders: the node's partial on local rank 0 (one step of the arena for a
small message), one exchange between the leaders (each sends its partial to the
others and combines all of them in node order, so every leader holds the same
bits), the node's copy back from local rank 0. One network round, which is all
a small all_reduce can afford; Gloo's own all_reduce takes two (ring) or more.

On the rails (Horovod's hierarchical all-reduce, pipelined as coll/han does):
per segment, a node reduce-scatter gives local rank l the node's partial of the
l-th shard, rail l all-reduces it between the nodes (all rails at once, each
rank sending 1/L of the message: between two nodes one exchange of the
shards, combined in node order; between more, Gloo's all-reduce), and a node
all-gather puts the shards together; the node stages of one segment run while
Gloo carries another.
"""
from __future__ import annotations

import torch

from shmcoll import ops
from shmcoll.placement.across import pipeline, stages
from shmcoll.placement.across.network import EXCHANGE_NODES
from shmcoll.staging import staged, unstage

def allreduce(shape, tensor: torch.Tensor, red: ops.Reduction, desc: int) -> None:
    flat = red.view(tensor)
    if flat.numel() == 0:
        return
    if not shape.uniform or flat.nbytes <= shape.small_bytes:
        return by_leaders(shape, flat, red, desc)
    return on_rails(shape, flat, red, desc)


def by_leaders(shape, flat: torch.Tensor, red: ops.Reduction, desc: int) -> None:
    work = staged(flat)
    stages.reduce(shape, work, red, 0, desc)
    if shape.local_rank == 0:
        between_leaders(shape, work, red)
        red.average(work)
    stages.broadcast(shape, work.data_ptr(), work.nbytes, 0, desc)
    unstage(flat, work)


def between_leaders(shape, work: torch.Tensor, red: ops.Reduction) -> None:
    """``work``: this node's partial on its leader -> the group's result (before AVG's division). The
    leaders exchange their partials directly between two nodes, and for small messages up to
    EXCHANGE_NODES; else Gloo's all_reduce (which sends each byte fewer times as nodes grow)."""
    link = shape.leaders if work.nbytes <= shape.small_bytes else shape.rail  # both: every node's leader
    nodes = len(link.ranks)
    if nodes == 2 or (nodes <= EXCHANGE_NODES and work.nbytes <= shape.small_bytes):
        parts = torch.empty((nodes, work.numel()), dtype=work.dtype)
        link.exchange(work, {m: parts[m] for m in range(nodes) if m != link.position})
        parts[link.position].copy_(work)
        stages.combine(red, work, parts)
    else:
        link.wait(link.allreduce(work, red.op.gloo))


def on_rails(shape, flat: torch.Tensor, red: ops.Reduction, desc: int) -> None:
    count, itemsize, L = flat.numel(), flat.element_size(), shape.local_size
    block = -(-count // L)  # elements of each local rank's shard
    if block * L == count and flat.is_contiguous():
        work = flat
    else:
        work = torch.zeros(block * L, dtype=flat.dtype)
        work[:count].copy_(flat.reshape(-1))
    base, link = work.data_ptr(), shape.rail
    # Between two nodes the rail's all-reduce is one exchange of the shards, combined here in node order
    # (so both ranks get the same bits): one network round, where Gloo's ring takes two for the same
    # bytes (1 MiB: 8.9 against 9.4 ms on the shaped link, 2.4 against 2.9 ms unshaped; BENCHMARKS.md).
    pair = len(link.ranks) == 2
    other = 1 - link.position
    partials = torch.empty((2 if pair else 1, block), dtype=flat.dtype)  # rows: the nodes' shards, in node order
    shard = partials[link.position if pair else 0]

    def node_reduce_scatter(cut):
        lo, hi = cut
        stages.reduce_scatter(shape, work[lo:], hi - lo, block, red, shard[lo:hi], desc)

    def rail_allreduce(cut):
        lo, hi = cut
        if pair:
            return link.swap({other: shard[lo:hi]}, {other: partials[other, lo:hi]})
        return link.allreduce(shard[lo:hi], red.op.gloo)

    def node_allgather(cut):
        lo, hi = cut
        if pair:
            stages.combine(red, shard[lo:hi], partials[:, lo:hi])
        red.average(shard[lo:hi])
        stages.allgather(shape, shard[lo:hi].data_ptr(), (hi - lo) * itemsize, base + lo * itemsize,
                         block * itemsize, desc)

    per_segment = max(1, shape.segment_bytes // (L * itemsize))
    pipeline.run(link, pipeline.segments(block, per_segment), node_reduce_scatter, rail_allreduce, node_allgather)
    if work is not flat:
        flat.copy_(work[:count].view_as(flat))
