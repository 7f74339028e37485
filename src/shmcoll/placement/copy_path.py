"""The copy path on a node: each collective's schedule through the arena, split over the rank's lanes
where its size calls for them (``Lanes.for_bytes``; an all-reduce's route says it), else on the caller's
thread.

One node (``placement.node``) and the node stages of the plans across nodes (``placement.across.stages``)
both run their copy path here, so the choice between lanes and one thread is made in one place. Arguments
are raw addresses and the kernels' handles, as ``shmcoll.algorithms`` takes them.
"""
from __future__ import annotations

from shmcoll import lanes as _lanes
from shmcoll.algorithms import allgather as _allgather
from shmcoll.algorithms import allreduce as _allreduce
from shmcoll.algorithms import broadcast as _broadcast
from shmcoll.algorithms import reduce_scatter as _reduce_scatter

# The all-reduce's schedules on the caller's thread, by the kind its route names (``OneNode.allreduce_route``).
_ON_ONE_LANE = {_lanes.ONE_SHOT: _allreduce.one_shot, _lanes.ONE_SHOT_STEPS: _allreduce.one_shot_steps,
                _lanes.CHUNKED: _allreduce.reduce_scatter_allgather}


def allreduce(arena, lanes, route: tuple[int, int], count: int, itemsize: int, addr: int, kernel: int, op: int,
              scale: float, desc: int) -> None:
    """All-reduce ``count`` items of ``itemsize`` bytes at ``addr`` in place by ``route``: (its schedule, the
    lanes it splits over), as ``OneNode.allreduce_route`` decides it for the size."""
    kind, width = route
    if width > 1:
        return lanes.run(kind, width, desc, count, itemsize, addr, kernel=kernel, op=op, scale=scale)
    _ON_ONE_LANE[kind](arena, addr, count, itemsize, kernel, op, scale, desc)


def reduce(arena, lanes, count: int, itemsize: int, addr: int, kernel: int, op: int, scale: float, root: int,
           desc: int) -> None:
    """Reduce ``count`` items at ``addr`` into ``root``'s in place, chunked (the others' are scratch)."""
    width = lanes.for_bytes(count * itemsize)
    if width > 1:
        return lanes.run(_lanes.CHUNKED, width, desc, count, itemsize, addr, kernel=kernel, op=op, scale=scale,
                         root=root)
    _allreduce.reduce_scatter_allgather(arena, addr, count, itemsize, kernel, op, scale, desc, root=root)


def reduce_scatter(arena, lanes, block: int, itemsize: int, addr: int, block_stride: int, out: int, kernel: int,
                   op: int, scale: float, desc: int) -> None:
    """Local rank l gets block l (``block`` items at ``addr`` + l * ``block_stride`` items) reduced over the
    ranks, at ``out``."""
    width = lanes.for_bytes(block * itemsize)
    if width > 1:
        return lanes.run(_lanes.REDUCE_SCATTER, width, desc, block, itemsize, addr, out=out,
                         block_stride=block_stride, kernel=kernel, op=op, scale=scale)
    _reduce_scatter.reduce_scatter(arena, addr, block, itemsize, kernel, op, scale, out, desc,
                                   block_stride=block_stride)


def broadcast(arena, lanes, addr: int, nbytes: int, root: int, desc: int) -> None:
    """``root``'s ``nbytes`` at ``addr`` to every local rank's ``addr``."""
    width = lanes.for_bytes(nbytes)
    if width > 1:
        return lanes.run(_lanes.BROADCAST, width, desc, nbytes, 1, addr, root=root)
    _broadcast.broadcast(arena, addr, nbytes, root, desc)


def allgather(arena, lanes, addr: int, nbytes: int, outputs, desc: int) -> None:
    """Local rank l's ``nbytes`` at ``addr`` to its block of ``outputs`` (``allgather.Blocks``) on every
    local rank."""
    width = lanes.for_bytes(nbytes)
    if width > 1:
        blocks = _allgather.Blocks(outputs, nbytes)
        return lanes.run(_lanes.ALLGATHER, width, desc, nbytes, 1, addr, out=blocks.out, out_stride=blocks.stride,
                         blocks=blocks.table)
    _allgather.allgather(arena, addr, nbytes, outputs, desc)
