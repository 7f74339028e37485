"""Reduce to one root: every rank reduces 1/L of each chunk, the root gathers the shares."""
from shmcoll._copy import copy


def reduce(arena, addr: int, count: int, itemsize: int, np_dtype, kernel, op: int, scale: float, root: int,
           desc: int) -> None:
    """The reduction of ``count`` elements at ``addr`` over local ranks lands at ``addr`` on ``root``."""
    me, size = arena.local_rank, arena.local_size
    per_chunk = arena.chunk_bytes // itemsize
    for start in range(0, count, per_chunk):
        n = min(per_chunk, count - start)
        chunk_addr = addr + start * itemsize
        lo, hi = me * n // size, (me + 1) * n // size

        step = arena.begin_write()
        buf = step & 1
        copy(arena.slot(buf, me), chunk_addr, n * itemsize)
        arena.post(step, desc)
        arena.wait_all(step)
        if start == 0:
            arena.check_same_collective(step, desc)
        rows = arena.rows(buf, np_dtype)
        kernel(arena.rows(buf ^ 1, np_dtype)[me, lo:hi], rows[0, lo:hi], rows[1:, lo:hi], op, scale)

        step = arena.begin_write()
        arena.post(step, desc)
        if me == root:
            arena.wait_all(step)
            for peer in range(size):
                plo, phi = peer * n // size, (peer + 1) * n // size
                copy(chunk_addr + plo * itemsize, arena.slot(buf ^ 1, peer) + plo * itemsize,
                     (phi - plo) * itemsize)
