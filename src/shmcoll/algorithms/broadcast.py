"""Broadcast: the root fills a whole buffer (all L slots) per step; the others copy it out."""
from shmcoll._copy import copy


def broadcast(arena, addr: int, nbytes: int, root: int, desc: int) -> None:
    """Copy ``nbytes`` at ``addr`` on local rank ``root`` to ``addr`` on every local rank."""
    me = arena.local_rank
    capacity = arena.buffer_bytes
    for start in range(0, nbytes, capacity):
        n = min(capacity, nbytes - start)
        if me == root:
            step = arena.begin_write()
            copy(arena.slot(step & 1, 0), addr + start, n)
            arena.post(step, desc)
        else:
            # Posting with nothing written tells the root we finished reading earlier steps.
            step = arena.next_step()
            arena.post(step, desc)
        if start == 0:
            # Everyone, the root too, checks that every rank is in this same broadcast before
            # anyone reads: a rank that believes it is the root has written the buffer as well.
            arena.wait_all(step)
            arena.check_same_collective(step, desc)
        elif me != root:
            arena.wait_rank(root, step)
        if me != root:
            copy(addr + start, arena.slot(step & 1, 0), n)
