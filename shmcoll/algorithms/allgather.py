"""All-gather: each step every rank publishes up to one slot of its input and copies all slots out."""
from shmcoll._copy import copy, copy_strided


def allgather(arena, addr: int, nbytes: int, outputs, desc: int) -> None:
    """``outputs``: one address per local rank, or (base, stride) for a contiguous output."""
    me, size, chunk = arena.local_rank, arena.local_size, arena.chunk_bytes
    start = 0
    while True:
        n = min(chunk, nbytes - start)
        step = arena.begin_write()
        buf = step & 1
        copy(arena.slot(buf, me), addr + start, n)
        arena.post(step, desc)
        arena.wait_all(step)
        if start == 0:
            arena.check_same_collective(step, desc)
        if isinstance(outputs, tuple):
            base, stride = outputs
            copy_strided(base + start, stride, arena.slot(buf, 0), chunk, n, size)
        else:
            for peer in range(size):
                copy(outputs[peer] + start, arena.slot(buf, peer), n)
        start += n
        if start >= nbytes:
            return
