"""gather across nodes: each rank's block crosses the network once.

Small (the root's whole buffer up to SHMCOLL_SMALL_BYTES): every node gathers its
ranks' blocks on its *entry* (the root's local rank; the rail of the root's local
rank links each entry to the root) in shared memory, and the other nodes' entries
send them to the root, L blocks in one message: one message per node where
Gloo's gather sends L. Large: the root's node gathers in shared memory while
every rank of the other nodes sends its block straight to the root; collecting
it on an entry first would copy every byte twice more for nothing, as the bytes
on the network are the same. ``scatter`` is the same plan run backwards.
"""
from __future__ import annotations

import torch

from shmcoll.placement.across import pipeline, stages
from shmcoll.placement.across.barrier import barrier
from shmcoll.staging import staged_empty, unstage


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


def gather(shape, links, outputs: list[torch.Tensor] | None, input: torch.Tensor, root: int, desc: int) -> None:
    """Nodes of equal size; on the root, ``outputs[r]`` receives rank r's ``input``."""
    source = _bytes(input.contiguous())
    nbytes = source.numel()
    if nbytes == 0:  # still a collective, as on one node: the ranks meet
        return barrier(shape, links, desc)
    N, L = len(shape.nodes), shape.local_size
    root_node, entry = shape.node_of(root)
    link = links.rail if shape.local_rank == entry else None  # the entries' rail: the root's
    is_root = shape.rank == root
    staged = [staged_empty(out) for out in outputs] if is_root else []
    targets = [_bytes(t) for t in staged]
    if not shape.small(nbytes * shape.size):
        _direct_gather(shape, links, source, targets, root, root_node, entry, desc)
        for out, target in zip(outputs if is_root else (), staged):
            unstage(out, target)
        return
    rows = {}  # cut -> on an entry, (node, local rank, segment) of what it gathered or received

    def node_gather(cut):
        lo, hi = cut
        mine = torch.empty((N, L, hi - lo), dtype=torch.uint8) if link is not None else None
        if mine is not None:
            rows[cut] = mine
        stages.gather(shape, source[lo:].data_ptr(), hi - lo, entry,
                      [mine[shape.node, l].data_ptr() for l in range(L)] if mine is not None else [], desc)

    def to_root(cut):
        if link is None:
            return None
        mine = rows[cut]
        if not is_root:
            return link.send(mine[shape.node], root_node)
        return link.swap({}, {n: mine[n] for n in range(N) if n != root_node})

    def place(cut):
        if is_root:
            lo, hi = cut
            mine = rows.pop(cut)
            for r, target in enumerate(targets):
                n, l = shape.node_of(r)
                target[lo:hi].copy_(mine[n, l])
        else:
            rows.pop(cut, None)

    pipeline.run(link, pipeline.segments(nbytes, max(1, shape.segment_bytes // shape.size)), node_gather, to_root,
                 place)
    for out, target in zip(outputs if is_root else (), staged):
        unstage(out, target)


def scatter(shape, links, output: torch.Tensor, inputs: list[torch.Tensor] | None, root: int, desc: int) -> None:
    """Nodes of equal size; from the root's ``inputs[r]``, rank r's ``output``."""
    nbytes = output.nbytes
    if nbytes == 0:  # still a collective, as on one node: the ranks meet
        return barrier(shape, links, desc)
    N, L = len(shape.nodes), shape.local_size
    root_node, entry = shape.node_of(root)
    link = links.rail if shape.local_rank == entry else None
    is_root = shape.rank == root
    target = staged_empty(output)
    received = _bytes(target)
    sources = [_bytes(t.contiguous()) for t in inputs] if is_root else None
    if not shape.small(nbytes * shape.size):
        _direct_scatter(shape, links, received, sources, root, root_node, entry, desc)
        return unstage(output, target)
    rows = {}

    def from_root(cut):
        if link is None:
            return None
        lo, hi = cut
        mine = rows[cut] = torch.empty((N, L, hi - lo), dtype=torch.uint8)
        if not is_root:
            return link.recv(mine[shape.node], root_node)
        for r, block in enumerate(sources):
            n, l = shape.node_of(r)
            mine[n, l].copy_(block[lo:hi])
        return link.swap({n: mine[n] for n in range(N) if n != root_node}, {})

    def node_scatter(cut):
        lo, hi = cut
        mine = rows.pop(cut, None)
        stages.scatter(shape, [mine[shape.node, l].data_ptr() for l in range(L)] if mine is not None else [],
                       hi - lo, entry, received[lo:].data_ptr(), desc)

    pipeline.run(link, pipeline.segments(nbytes, max(1, shape.segment_bytes // shape.size)), lambda cut: None,
                 from_root, node_scatter)
    unstage(output, target)


def _direct_gather(shape, links, source, targets, root: int, root_node: int, entry: int, desc: int) -> None:
    pairs, on_root_node = links.pairs, shape.node == root_node
    remote = [r for r in range(shape.size) if shape.where[r][0] != root_node]
    if shape.rank == root:
        pending = pairs.swap({}, {r: targets[r] for r in remote})
    elif not on_root_node:
        pending = pairs.swap({root: source}, {})
    if on_root_node:
        stages.gather(shape, source.data_ptr(), source.numel(), entry,
                      [targets[r].data_ptr() for r in shape.local_ranks] if shape.rank == root else [], desc)
    if shape.rank == root or not on_root_node:
        pairs.wait(pending)


def _direct_scatter(shape, links, received, sources, root: int, root_node: int, entry: int, desc: int) -> None:
    pairs, on_root_node = links.pairs, shape.node == root_node
    remote = [r for r in range(shape.size) if shape.where[r][0] != root_node]
    if shape.rank == root:
        pending = pairs.swap({r: sources[r] for r in remote}, {})
    elif not on_root_node:
        pending = pairs.swap({}, {root: received})
    if on_root_node:
        stages.scatter(shape, [sources[r].data_ptr() for r in shape.local_ranks] if shape.rank == root else [],
                       received.numel(), entry, received.data_ptr(), desc)
    if shape.rank == root or not on_root_node:
        pairs.wait(pending)
