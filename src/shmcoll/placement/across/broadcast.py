"""broadcast across nodes: the root's rail carries the message to every node, each node copies it around.

Per segment: the rail of the root's local rank broadcasts it from the root's
node (one rank per node receives it), then each other node broadcasts it in
shared memory from that rank, while the rail carries the next segment; the
root's node broadcasts from the root meanwhile. When some node lacks the
root's local rank (nodes of unequal size), the root's node first copies the
message to its local rank 0 and rail 0, which every node is on, carries it.
Up to SHMCOLL_SMALL_BYTES the same, on the leaders' link instead of rail 0:
the small messages' connections, never paced by the bulk's rate (``Shape``).
"""
from __future__ import annotations

import torch

from shmcoll.placement.across import pipeline, stages
from shmcoll.placement.across.barrier import barrier
from shmcoll.staging import flat_bytes, staged, unstage


def broadcast(shape, links, tensor: torch.Tensor, root: int, desc: int) -> None:
    if tensor.numel() == 0:  # still a collective, as on one node: the ranks meet
        return barrier(shape, links, desc)
    work = staged(tensor)
    data = flat_bytes(work)
    base, nbytes = data.data_ptr(), data.numel()
    root_node, root_local = shape.node_of(root)
    small = shape.small(nbytes)
    # The local rank whose link carries it: the root's, if every node has one; else (and when small) the leader.
    entry = root_local if len(shape.rail_nodes[root_local]) == len(shape.nodes) and not small else 0
    on_root_node = shape.node == root_node
    if on_root_node and entry != root_local:
        stages.broadcast(shape, base, nbytes, root_local, desc)
    link = (links.leaders if small else links.rail) if shape.local_rank == entry else None

    def root_node_stage(cut):
        if on_root_node and entry == root_local:
            lo, hi = cut
            stages.broadcast(shape, base + lo, hi - lo, root_local, desc)

    def rail(cut):
        if link is None:
            return None
        lo, hi = cut
        return link.broadcast(data[lo:hi], shape.rail_nodes[entry].index(root_node))

    def other_node_stage(cut):
        if not on_root_node:
            lo, hi = cut
            stages.broadcast(shape, base + lo, hi - lo, entry, desc)

    pipeline.run(link, pipeline.segments(nbytes, shape.segment_bytes), root_node_stage, rail, other_node_stage)
    unstage(tensor, work)
