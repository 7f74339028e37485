"""reduce across nodes: every node's partial crosses the network once, towards the root's node.

Small messages (or nodes of unequal size): the node's partial on one local rank,
the *entry* (the root's local rank, if every node has one, else 0), whose rail
reduces the partials to the root's node; there the entry hands the result to
the root. Large ones, per segment: a node reduce-scatter (local rank l holds the
node's partial of the l-th shard), every rail reduces its shard to the root's
node, and the root's node gathers the shards on the root.
"""
from __future__ import annotations

import torch

from shmcoll import ops
from shmcoll.placement.across import pipeline, stages
from shmcoll.staging import staged, unstage


def reduce(shape, tensor: torch.Tensor, root: int, red: ops.Reduction, desc: int) -> None:
    flat = red.view(tensor)
    if flat.numel() == 0:
        return
    root_node, root_local = shape.node_of(root)
    # Only the root's tensor receives the result; the others' must stay as they were.
    work = staged(flat) if shape.rank == root else flat.contiguous().clone()
    if not shape.uniform or work.nbytes <= shape.small_bytes:
        _by_entry(shape, work, root_node, root_local, red, desc)
    else:
        _on_rails(shape, work, root_node, root_local, red, desc)
    if shape.rank == root:
        red.average(work)
        unstage(flat, work)


def _by_entry(shape, work, root_node: int, root_local: int, red, desc: int) -> None:
    entry = root_local if len(shape.rail_nodes[root_local]) == len(shape.nodes) else 0
    stages.reduce(shape, work, red, entry, desc)
    if shape.local_rank == entry:
        link, to = shape.rail, shape.rail_nodes[entry].index(root_node)
        parts = _toward(link, work, to, red)
        if parts is not None:
            link.wait(parts.pending)
            parts.combine(work)
    if shape.node == root_node and entry != root_local:
        stages.broadcast(shape, work.data_ptr(), work.nbytes, entry, desc)


def _on_rails(shape, work, root_node: int, root_local: int, red, desc: int) -> None:
    count, itemsize, L = work.numel(), work.element_size(), shape.local_size
    block = -(-count // L)
    padded = work if block * L == count else torch.cat([work, work.new_zeros(block * L - count)])
    shard = torch.empty(block, dtype=work.dtype)
    base, link, to = padded.data_ptr(), shape.rail, shape.rail_nodes[shape.local_rank].index(root_node)
    on_root_node = shape.node == root_node
    in_flight = {}

    def node_reduce_scatter(cut):
        lo, hi = cut
        stages.reduce_scatter(shape, padded[lo:], hi - lo, block, red, shard[lo:hi], desc)

    def rail_reduce(cut):
        lo, hi = cut
        in_flight[cut] = _toward(link, shard[lo:hi], to, red)
        return in_flight[cut].pending

    def node_gather(cut):
        lo, hi = cut
        parts = in_flight.pop(cut)
        if on_root_node:
            parts.combine(shard[lo:hi])
            stages.gather(shape, shard[lo:hi].data_ptr(), (hi - lo) * itemsize, root_local,
                          [base + (l * block + lo) * itemsize for l in range(L)], desc)

    per_segment = max(1, shape.segment_bytes // (L * itemsize))
    pipeline.run(link, pipeline.segments(block, per_segment), node_reduce_scatter, rail_reduce, node_gather)
    if padded is not work:
        work.copy_(padded[:count])


class _Toward:
    """A node's partial on its way to the root's node over a rail: ``pending`` the network stage, then
    ``combine(result)`` on the root's node."""

    def __init__(self, pending, parts=None, red=None):
        self.pending, self._parts, self._red = pending, parts, red

    def combine(self, result: torch.Tensor) -> None:
        if self._parts is not None:
            stages.combine(self._red, result, self._parts)


def _toward(link, part: torch.Tensor, to: int, red) -> _Toward:
    """Between two nodes, the other node sends its partial and the root's node combines the two in node
    order: one message, where Gloo's reduce sends half of it back and forth first. More nodes: Gloo's."""
    if len(link.ranks) != 2:
        return _Toward(link.reduce(part, to, red.op.gloo))
    if link.position != to:
        return _Toward(link.send(part, to))
    parts = torch.empty((2, part.numel()), dtype=part.dtype)
    parts[to].copy_(part)
    return _Toward(link.recv(parts[1 - to], 1 - to), parts, red)
