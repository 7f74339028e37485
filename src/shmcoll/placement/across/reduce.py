"""reduce across nodes: every node's partial crosses the network once, towards the root's node.

Small messages (or nodes of unequal size): the node's partial on one local rank,
the *entry* (the root's local rank, if every node has one, else 0), whose rail
carries the partials to the root's node, where the entry combines them and hands
the result to the root. Large ones, per segment: a node reduce-scatter (local
rank l holds the node's partial of the l-th shard), every rail reduces its shard
to the root's node, and the root's node gathers the shards on the root. Between
two nodes a rail's reduction is one message (Gloo's reduce sends half of it back
and forth first); between more, small partials go straight to the root's node
and large ones are reduce-scattered there first (``partials``).
"""
from __future__ import annotations

import torch

from shmcoll import ops
from shmcoll.placement.across import partials, pipeline, stages
from shmcoll.placement.across.barrier import barrier
from shmcoll.placement.across.network import EXCHANGE_NODES
from shmcoll.staging import staged, unstage


def reduce(shape, links, tensor: torch.Tensor, root: int, red: ops.Reduction, desc: int) -> None:
    values = red.view(tensor)
    if values.numel() == 0:  # still a collective, as on one node: the ranks meet
        return barrier(shape, links, desc)
    root_node, root_local = shape.node_of(root)
    # Only the root's tensor receives the result; the others' must stay as they were.
    work = staged(values) if shape.rank == root else values.clone(memory_format=torch.contiguous_format)
    flat = work.view(-1)
    if shape.reduces_small(flat.nbytes):
        _by_entry(shape, links, flat, root_node, root_local, red, desc)
    else:
        _on_rails(shape, links, flat, root_node, root_local, red, desc)
    if shape.rank == root:
        red.average(flat)
        unstage(values, work)


def _one_round(link, small: bool) -> bool:
    members = len(link.ranks)
    return members == 2 or (small and members <= EXCHANGE_NODES)


def _by_entry(shape, links, flat, root_node: int, root_local: int, red, desc: int) -> None:
    entry = root_local if len(shape.rail_nodes[root_local]) == len(shape.nodes) else 0
    stages.reduce(shape, flat, red, entry, desc)
    if shape.local_rank == entry:
        link, to = links.rail, shape.rail_nodes[entry].index(root_node)
        link.wait(partials.toward(link, flat, to, red, _one_round(link, shape.small(flat.nbytes))))
    if shape.node == root_node and entry != root_local:
        stages.broadcast(shape, flat.data_ptr(), flat.nbytes, entry, desc)


def _on_rails(shape, links, flat, root_node: int, root_local: int, red, desc: int) -> None:
    count, itemsize, L = flat.numel(), flat.element_size(), shape.local_size
    block = -(-count // L)
    padded = flat if block * L == count else torch.cat([flat, flat.new_zeros(block * L - count)])
    shard = torch.empty(block, dtype=flat.dtype)
    base, link, to = padded.data_ptr(), links.rail, shape.rail_nodes[shape.local_rank].index(root_node)
    on_root_node = shape.node == root_node
    one_round = len(link.ranks) == 2

    def node_reduce_scatter(cut):
        lo, hi = cut
        stages.reduce_scatter(shape, padded[lo:], hi - lo, block, red, shard[lo:hi], desc)

    def rail_reduce(cut):
        lo, hi = cut
        return partials.toward(link, shard[lo:hi], to, red, one_round)

    def node_gather(cut):
        lo, hi = cut
        if on_root_node:
            stages.gather(shape, shard[lo:hi].data_ptr(), (hi - lo) * itemsize, root_local,
                          [base + (l * block + lo) * itemsize for l in range(L)], desc)

    per_segment = max(1, shape.segment_bytes // (L * itemsize))
    pipeline.run(link, pipeline.segments(block, per_segment), node_reduce_scatter, rail_reduce, node_gather)
    if padded is not flat:
        flat.copy_(padded[:count])
