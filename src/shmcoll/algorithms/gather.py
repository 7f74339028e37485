"""Gather to one root: each step every rank publishes up to a slot of its input; the root copies all out."""
from shmcoll._copy import copy


def gather(arena, addr: int, nbytes: int, root: int, outputs, desc: int) -> None:
    """On ``root``, ``outputs`` holds one address per local rank; elsewhere it is ignored."""
    me, size, chunk = arena.local_rank, arena.local_size, arena.chunk_bytes
    for start in range(0, nbytes, chunk):
        n = min(chunk, nbytes - start)
        step = arena.begin_write()
        buf = step & 1
        copy(arena.slot(buf, me), addr + start, n)
        arena.post(step, desc)
        if me == root:
            arena.wait_all(step)
            if start == 0:
                arena.check_same_collective(step, desc)
            for peer in range(size):
                copy(outputs[peer] + start, arena.slot(buf, peer), n)
