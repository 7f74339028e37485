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
            step = arena.step + 1
            arena.post(step, desc)
            arena.wait_rank(root, step)
            if start == 0:
                arena.check_same_collective(step, desc, among=root)
            copy(addr + start, arena.slot(step & 1, 0), n)
