"""All-gather: each step every rank publishes up to one slot of its input and copies all slots out.

A contiguous output (base, stride) runs whole in ``shmcoll._reduce`` (see
algorithms/allreduce.py); a list of separate outputs steps through Python.
"""
from shmcoll._copy import copy
from shmcoll.algorithms import schedule


def allgather(arena, addr: int, nbytes: int, outputs, desc: int) -> None:
    """``outputs``: one address per local rank, or (base, stride) for a contiguous output."""
    if isinstance(outputs, tuple):
        return allgather_strided(arena, addr, nbytes, *outputs, desc)
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
        for peer in range(size):
            copy(outputs[peer] + start, arena.slot(buf, peer), n)
        start += n
        if start >= nbytes:
            return


def allgather_strided(arena, addr: int, nbytes: int, out: int, stride: int, desc: int) -> None:
    """Rank r's ``nbytes`` at ``addr`` go to ``out + r * stride`` on every rank."""
    call = arena.schedule.allgather
    schedule.run(arena, desc, lambda base, resume: call(base, desc, addr, nbytes, out, stride, resume),
                 steps=-(-nbytes // arena.chunk_bytes))  # one per chunk
