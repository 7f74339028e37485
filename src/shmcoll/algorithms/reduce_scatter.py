"""Reduce-scatter: rank r ends with the reduction of block r of every rank's input.

Per step every rank publishes the same slice of each of its L blocks (L pieces
side by side in its slot); rank r reduces piece r of all slots, in rank order.
The whole schedule runs in ``shmcoll._schedules`` (see algorithms/allreduce.py).
"""
from shmcoll.algorithms import schedule


def reduce_scatter(arena, addr: int, block_count: int, itemsize: int, kernel: int, op: int, scale: float,
                   out_addr: int, desc: int, block_stride: int | None = None) -> None:
    """``addr``: L blocks of ``block_count`` elements, ``block_stride`` elements apart (default: back to
    back); our block's reduction goes to ``out_addr``."""
    call = arena.schedule.reduce_scatter
    stride = block_count if block_stride is None else block_stride
    schedule.run(arena, arena.schedule, desc, lambda base, resume: call(base, desc, addr, block_count, stride,
                                                                        itemsize, out_addr, kernel, op, scale, resume))


def single_copy(arena, addr: int, block_count: int, itemsize: int, kernel: int, op: int, scale: float,
                out_addr: int, desc: int, lanes: int = 1) -> None:
    """As ``reduce_scatter`` (blocks back to back), each rank reading its block of the others' inputs where
    they are (``_single_copy``), over ``lanes`` of its lanes; ``out_addr`` must not overlap the input."""
    sc = arena.single_copy
    schedule.run(arena, sc, desc, lambda base, resume: sc.reduce_scatter(base, desc, addr, block_count, block_count,
                                                                          itemsize, out_addr, kernel, op, scale,
                                                                          lanes, resume))
