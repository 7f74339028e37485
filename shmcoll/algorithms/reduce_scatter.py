"""Reduce-scatter: rank r ends with the reduction of block r of every rank's input.

Per step every rank publishes the same slice of each of its L blocks (L pieces
side by side in its slot); rank r reduces piece r of all slots, in rank order.
"""
from shmcoll._copy import copy, copy_strided


def reduce_scatter(arena, addr: int, block_count: int, itemsize: int, np_dtype, kernel, op: int, scale: float,
                   out_addr: int, desc: int) -> None:
    """``addr``: L blocks of ``block_count`` elements; our block's reduction goes to ``out_addr``."""
    me, size = arena.local_rank, arena.local_size
    piece = arena.chunk_bytes // (size * itemsize)  # elements of each block per step
    block_bytes = block_count * itemsize
    for start in range(0, block_count, piece):
        n = min(piece, block_count - start)
        step = arena.begin_write()
        buf = step & 1
        copy_strided(arena.slot(buf, me), n * itemsize, addr + start * itemsize, block_bytes, n * itemsize, size)
        arena.post(step, desc)
        arena.wait_all(step)
        if start == 0:
            arena.check_same_collective(step, desc)
        rows = arena.rows(buf, np_dtype)
        lo = me * n
        kernel(arena.scratch_view(np_dtype)[:n], rows[0, lo:lo + n], rows[1:, lo:lo + n], op, scale)
        copy(out_addr + start * itemsize, arena.scratch, n * itemsize)
