"""The node stages of the plans across nodes: shared memory inside this rank's node.

Each is one of the arena's schedules (``shmcoll.algorithms``) over raw
addresses, split over the rank's lanes where its size calls for them as on one
node (``placement.copy_path``), or its degenerate form when this rank is alone on its
node (no arena). Reductions here produce a node's *partial* result: the op of
``Reduction.across`` (AVG summed, PREMUL_SUM's factor applied once, here);
``partials`` combines the nodes' partials with the same kernels.
"""
from __future__ import annotations

import torch

from shmcoll import ops
from shmcoll._copy import copy
from shmcoll.algorithms import allreduce as _allreduce
from shmcoll.algorithms import barrier as _barrier
from shmcoll.algorithms import gather as _gather
from shmcoll.algorithms import scatter as _scatter
from shmcoll.placement import copy_path


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
    copy_path.reduce_scatter(shape.arena, shape.lanes, block_count, source.element_size(), source.data_ptr(),
                             block_stride, out.data_ptr(), red.kernel, op, scale, desc)


def reduce(shape, work: torch.Tensor, red: ops.Reduction, local_root: int, desc: int) -> None:
    """The node's partial of contiguous ``work`` into ``local_root``'s ``work`` (the others' are scratch)."""
    op, scale = red.across
    count, itemsize = work.numel(), work.element_size()
    if shape.arena is None:
        if scale != 1.0:
            work.mul_(scale)
    elif count * itemsize <= shape.one_shot_bytes:  # one step: every rank reduces, the root uses it
        _allreduce.one_shot(shape.arena, work.data_ptr(), count, itemsize, red.kernel, op, scale, desc)
    else:
        copy_path.reduce(shape.arena, shape.lanes, count, itemsize, work.data_ptr(), red.kernel, op, scale, local_root,
                         desc)


def allgather(shape, addr: int, nbytes: int, out: int, stride: int, desc: int) -> None:
    """Local rank l's ``nbytes`` at ``addr`` to ``out`` + l * ``stride`` on every local rank."""
    if shape.arena is None:
        copy(out, addr, nbytes) if out != addr else None
        return
    copy_path.allgather(shape.arena, shape.lanes, addr, nbytes, (out, stride), desc)


def allgather_to(shape, addr: int, nbytes: int, outputs: list[int], desc: int) -> None:
    """Local rank l's ``nbytes`` at ``addr`` to ``outputs[l]`` on every local rank."""
    if shape.arena is None:
        copy(outputs[0], addr, nbytes) if outputs[0] != addr else None
        return
    copy_path.allgather(shape.arena, shape.lanes, addr, nbytes, outputs, desc)


def broadcast(shape, addr: int, nbytes: int, local_root: int, desc: int) -> None:
    if shape.arena is None or not nbytes:
        return
    copy_path.broadcast(shape.arena, shape.lanes, addr, nbytes, local_root, desc)


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

