"""Broadcast: the root fills a whole buffer (every slot) per step; the others copy it out.

The whole schedule runs in ``shmcoll._reduce`` (see algorithms/allreduce.py).
"""
from shmcoll.algorithms import schedule


def broadcast(arena, addr: int, nbytes: int, root: int, desc: int) -> None:
    """Copy ``nbytes`` at ``addr`` on local rank ``root`` to ``addr`` on every local rank."""
    call = arena.schedule.broadcast
    schedule.run(arena, arena.schedule, desc, lambda base, resume: call(base, desc, addr, nbytes, root, resume))
