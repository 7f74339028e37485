"""All-gather: each step every rank publishes up to one slot of its input and copies all slots out.

A contiguous output (base, stride) runs whole in ``shmcoll._schedules`` (see
algorithms/allreduce.py); a list of separate outputs steps through Python, as
does a consumer that reads the slots where they are (``allgather_windows``:
the sparse all_reduce merges the ranks' values out of shared memory).
"""
from shmcoll._copy import copy
from shmcoll.algorithms import gather, schedule
from shmcoll.errors import ShmcollError


def allgather(arena, addr: int, nbytes: int, outputs, desc: int) -> None:
    """``outputs``: one address per local rank, or (base, stride) for a contiguous output."""
    if isinstance(outputs, tuple):
        return allgather_strided(arena, addr, nbytes, *outputs, desc)

    def copy_out(start: int, n: int, slots: list) -> None:
        for peer, slot in enumerate(slots):
            copy(outputs[peer] + start, slot, n)

    allgather_windows(arena, addr, nbytes, arena.chunk_bytes, copy_out, desc)


def allgather_windows(arena, addr: int, nbytes: int, window: int, consume, desc: int) -> None:
    """Each step publishes ``window`` bytes (at most a slot) of rank r's ``nbytes`` at ``addr``, then
    ``consume(start, n, slots)`` reads bytes [start, start + n) of every rank's input where they are,
    rank r's at ``slots[r]``: shared memory that a later step overwrites once ``consume`` returns."""
    me, size = arena.local_rank, arena.local_size
    start = 0
    while True:
        n = min(window, nbytes - start)
        step = arena.begin_write()
        buf = step & 1
        copy(arena.slot(buf, me), addr + start, n)
        arena.post(step, desc)
        arena.wait_all(step)
        if start == 0:
            arena.check_same_collective(step, desc)
        try:
            consume(start, n, [arena.slot(buf, peer) for peer in range(size)])
        except ShmcollError:
            raise  # seen by every rank
        except BaseException:
            arena.abandon()  # ours alone: the peers must not wait for our next step until the timeout
            raise
        start += n
        if start >= nbytes:
            return


def allgather_strided(arena, addr: int, nbytes: int, out: int, stride: int, desc: int) -> None:
    """Rank r's ``nbytes`` at ``addr`` go to ``out + r * stride`` on every rank."""
    call = arena.schedule.allgather
    schedule.run(arena, arena.schedule, desc, lambda base, resume: call(base, desc, addr, nbytes, out, stride,
                                                                        resume))


def single_copy(arena, addr: int, nbytes: int, out: int, stride: int, desc: int, lanes: int = 1) -> None:
    """As ``allgather_strided``, each rank reading the others' inputs where they are (``_single_copy``), over
    ``lanes`` of its lanes."""
    sc = arena.single_copy
    schedule.run(arena, sc, desc, lambda base, resume: sc.allgather(base, desc, addr, nbytes, out, stride, lanes,
                                                                     resume))


def single_copy_each(arena, addr: int, nbytes: int, outputs, desc: int, lanes: int = 1) -> None:
    """As ``allgather`` into one address per local rank, each rank reading the others' inputs where they are
    (over ``lanes`` of its lanes): single copy's gather with every rank a root."""
    gather.single_copy(arena, addr, nbytes, gather.EVERY_RANK, outputs, desc, lanes)
