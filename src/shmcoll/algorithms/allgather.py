"""All-gather: each step every rank publishes up to one slot of its input and copies all slots out.

The output, one tensor (base, stride) or one per rank (the list form), runs whole in
``shmcoll._schedules`` (see algorithms/allreduce.py); a consumer that reads the
slots where they are steps through Python (``allgather_windows``: the sparse
all_reduce merges the ranks' values out of shared memory).
"""
from array import array

from shmcoll._copy import copy
from shmcoll.algorithms import gather, schedule
from shmcoll.errors import ShmcollError


class Blocks:
    """Where an all-gather's output goes, as the C schedules take it (``block_at`` in allgather.pxi, and a
    lanes' job): ``outputs`` is one address per local rank, or (base, stride) for one contiguous output.
    A table of addresses lives as long as this object."""

    def __init__(self, outputs, nbytes: int):
        if isinstance(outputs, tuple):
            self.out, self.stride = outputs
            self._table, self.table = None, 0
        else:
            self.out, self.stride = 0, nbytes  # with a table, the stride is the blocks' span (streaming's rule)
            self._table = array("Q", outputs)
            self.table = self._table.buffer_info()[0]


def allgather(arena, addr: int, nbytes: int, outputs, desc: int) -> None:
    """Rank r's ``nbytes`` at ``addr`` go to its block of ``outputs`` (``Blocks``) on every rank."""
    blocks = Blocks(outputs, nbytes)
    call = arena.schedule.allgather
    schedule.run(arena, arena.schedule, desc, lambda base, resume: call(base, desc, addr, nbytes, blocks.out,
                                                                        blocks.stride, blocks.table, resume))


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


def single_copy(arena, addr: int, nbytes: int, out: int, stride: int, desc: int, lanes: int = 1) -> None:
    """As ``allgather`` into (``out``, ``stride``), each rank reading the others' inputs where they are
    (``_single_copy``), over ``lanes`` of its lanes."""
    sc = arena.single_copy
    schedule.run(arena, sc, desc, lambda base, resume: sc.allgather(base, desc, addr, nbytes, out, stride, lanes,
                                                                     resume))


def single_copy_each(arena, addr: int, nbytes: int, outputs, desc: int, lanes: int = 1) -> None:
    """As ``allgather`` into one address per local rank, each rank reading the others' inputs where they are
    (over ``lanes`` of its lanes): single copy's gather with every rank a root."""
    gather.single_copy(arena, addr, nbytes, gather.EVERY_RANK, outputs, desc, lanes)
