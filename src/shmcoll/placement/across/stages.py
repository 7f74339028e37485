"""The node stages of the plans across nodes: shared memory inside this rank's node.

Each is one of the arena's schedules (``shmcoll.algorithms``) over raw
addresses, split over the rank's lanes (``shmcoll.lanes``) where its size calls
for them as on one node, or its degenerate form when this rank is alone on its
node (no arena). Reductions here produce a node's *partial* result: the op of
``Reduction.across`` (AVG summed, PREMUL_SUM's factor applied once, here);
``partials`` combines the nodes' partials with the same kernels.
"""
from __future__ import annotations

import torch

from shmcoll import lanes as _lanes
from shmcoll import ops
from shmcoll._copy import copy
from shmcoll.algorithms import allgather as _allgather
from shmcoll.algorithms import allreduce as _allreduce
from shmcoll.algorithms import barrier as _barrier
from shmcoll.algorithms import broadcast as _broadcast
from shmcoll.algorithms import gather as _gather
from shmcoll.algorithms import reduce_scatter as _reduce_scatter
from shmcoll.algorithms import scatter as _scatter


def reduce_scatter(shape, source: torch.Tensor, block_count: int, block_stride: int, red: ops.Reduction,
                   out: torch.Tensor, desc: int) -> None:
    """Local rank l gets the node's partial of block l (``block_count`` elements of contiguous ``source``
    from l * ``block_stride`` on) in ``out`` (contiguous, ``block_count`` elements)."""
    op, scale = red.across
    if shape.arena is None:  # a node of one rank: its partial is its input (times PREMUL_SUM's factor)
        out.copy_(source.view(-1)[:block_count])
        if scale != 1.0:
            out.mul_(scale)
        return
    itemsize = source.element_size()
    lanes = shape.lanes.for_bytes(block_count * itemsize)
    if lanes > 1:
        return shape.lanes.run(_lanes.REDUCE_SCATTER, lanes, desc, block_count, itemsize, source.data_ptr(),
                               out=out.data_ptr(), block_stride=block_stride, kernel=red.kernel, op=op, scale=scale)
    _reduce_scatter.reduce_scatter(shape.arena, source.data_ptr(), block_count, itemsize, red.kernel, op, scale,
                                   out.data_ptr(), desc, block_stride=block_stride)


def reduce(shape, work: torch.Tensor, red: ops.Reduction, local_root: int, desc: int) -> None:
    """The node's partial of contiguous ``work`` into ``local_root``'s ``work`` (the others' are scratch)."""
    op, scale = red.across
    count, itemsize = work.numel(), work.element_size()
    if shape.arena is None:
        if scale != 1.0:
            work.mul_(scale)
    elif count * itemsize <= shape.one_shot_bytes:  # one step: every rank reduces, the root uses it
        _allreduce.one_shot(shape.arena, work.data_ptr(), count, itemsize, red.kernel, op, scale, desc)
    elif (lanes := shape.lanes.for_bytes(count * itemsize)) > 1:
        shape.lanes.run(_lanes.CHUNKED, lanes, desc, count, itemsize, work.data_ptr(), kernel=red.kernel, op=op,
                        scale=scale, root=local_root)
    else:
        _allreduce.reduce_scatter_allgather(shape.arena, work.data_ptr(), count, itemsize, red.kernel, op, scale,
                                            desc, root=local_root)


def allgather(shape, addr: int, nbytes: int, out: int, stride: int, desc: int) -> None:
    """Local rank l's ``nbytes`` at ``addr`` to ``out`` + l * ``stride`` on every local rank."""
    if shape.arena is None:
        copy(out, addr, nbytes) if out != addr else None
        return
    _copy_path(shape, addr, nbytes, (out, stride), desc)


def allgather_to(shape, addr: int, nbytes: int, outputs: list[int], desc: int) -> None:
    """Local rank l's ``nbytes`` at ``addr`` to ``outputs[l]`` on every local rank."""
    if shape.arena is None:
        copy(outputs[0], addr, nbytes) if outputs[0] != addr else None
        return
    _copy_path(shape, addr, nbytes, outputs, desc)


def _copy_path(shape, addr: int, nbytes: int, outputs, desc: int) -> None:
    """The node's all-gather into ``outputs`` (``allgather.Blocks``), over the lanes where it splits."""
    lanes = shape.lanes.for_bytes(nbytes)
    if lanes > 1:
        blocks = _allgather.Blocks(outputs, nbytes)
        return shape.lanes.run(_lanes.ALLGATHER, lanes, desc, nbytes, 1, addr, out=blocks.out,
                               out_stride=blocks.stride, blocks=blocks.table)
    _allgather.allgather(shape.arena, addr, nbytes, outputs, desc)


def broadcast(shape, addr: int, nbytes: int, local_root: int, desc: int) -> None:
    if shape.arena is None or not nbytes:
        return
    lanes = shape.lanes.for_bytes(nbytes)
    if lanes > 1:
        return shape.lanes.run(_lanes.BROADCAST, lanes, desc, nbytes, 1, addr, root=local_root)
    _broadcast.broadcast(shape.arena, addr, nbytes, local_root, desc)


def gather(shape, addr: int, nbytes: int, local_root: int, outputs: list[int], desc: int) -> None:
    """On ``local_root``, ``outputs[l]`` receives local rank l's ``nbytes`` at ``addr``."""
    if shape.arena is None:
        copy(outputs[0], addr, nbytes)
        return
    _gather.gather(shape.arena, addr, nbytes, local_root, outputs, desc)


def scatter(shape, inputs: list[int], nbytes: int, local_root: int, out: int, desc: int) -> None:
    """From ``local_root``'s ``inputs[l]``, ``nbytes`` to ``out`` on local rank l."""
    if shape.arena is None:
        copy(out, inputs[0], nbytes)
        return
    _scatter.scatter(shape.arena, inputs, nbytes, local_root, out, desc)


def barrier(shape, desc: int) -> None:
    if shape.arena is not None:
        _barrier.barrier(shape.arena, desc)

