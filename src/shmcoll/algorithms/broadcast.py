"""Broadcast: the root fills a whole buffer (every slot) per step; the others copy it out.

The whole schedule runs in ``shmcoll._schedules`` (see algorithms/allreduce.py).
"""
from shmcoll.algorithms import schedule


def broadcast(arena, addr: int, nbytes: int, root: int, desc: int) -> None:
    """Copy ``nbytes`` at ``addr`` on local rank ``root`` to ``addr`` on every local rank."""
    call = arena.schedule.broadcast
    schedule.run(arena, arena.schedule, desc, lambda base, resume: call(base, desc, addr, nbytes, root, resume))


def single_copy(arena, addr: int, nbytes: int, root: int, desc: int, lanes: int = 1) -> None:
    """As ``broadcast``, every rank reading the root's buffer where it is (``_single_copy``), over ``lanes``
    of its lanes."""
    sc = arena.single_copy
    schedule.run(arena, sc, desc, lambda base, resume: sc.broadcast(base, desc, addr, nbytes, root, lanes, resume))
