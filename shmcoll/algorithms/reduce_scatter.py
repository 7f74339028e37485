"""Reduce-scatter: rank r ends with the reduction of block r of every rank's input.

Per step every rank publishes the same slice of each of its L blocks (L pieces
side by side in its slot); rank r reduces piece r of all slots, in rank order.
The whole schedule runs in ``shmcoll._reduce`` (see algorithms/allreduce.py).
"""
from shmcoll._reduce import DONE
from shmcoll.algorithms.allreduce import settle


def reduce_scatter(arena, addr: int, block_count: int, itemsize: int, kernel: int, op: int, scale: float,
                   out_addr: int, desc: int) -> None:
    """``addr``: L blocks of ``block_count`` elements; our block's reduction goes to ``out_addr``."""
    base = arena.begin_write() - 1
    steps = -(-block_count // (arena.chunk_bytes // (arena.local_size * itemsize)))
    schedule = arena.schedule
    status = schedule.reduce_scatter(base & 0xFFFFFFFF, desc, addr, block_count, itemsize, out_addr, kernel, op,
                                     scale, -1)
    while status != DONE:
        step = base + 1 if status < 0 else base + status + 1  # position c waits for step base + c + 1
        arena.step = step
        settle(arena, status, step, desc)
        status = schedule.reduce_scatter(base & 0xFFFFFFFF, desc, addr, block_count, itemsize, out_addr, kernel,
                                         op, scale, status)
    arena.step = arena.all_reached = base + steps
