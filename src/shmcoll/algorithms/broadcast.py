"""Broadcast: the root fills a whole buffer (every slot) per step; the others copy it out.

The whole schedule runs in ``shmcoll._reduce`` (see algorithms/allreduce.py).
"""
from shmcoll.algorithms import schedule


def broadcast(arena, addr: int, nbytes: int, root: int, desc: int) -> None:
    """Copy ``nbytes`` at ``addr`` on local rank ``root`` to ``addr`` on every local rank."""
    call = arena.schedule.broadcast
    steps = -(-nbytes // (arena.local_size * arena.chunk_bytes))  # one per buffer-full
    # Every rank waits for all at the first step (the check that all are in this broadcast), later
    # only for the root.
    schedule.run(arena, desc, lambda base, resume: call(base, desc, addr, nbytes, root, resume),
                 steps=steps, last_waits_for_all=steps == 1)
