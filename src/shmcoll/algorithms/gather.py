"""Gather to one root: each step every rank publishes up to a slot of its input; the root copies all out."""
import numpy as np

from shmcoll._copy import copy
from shmcoll.algorithms import schedule

# A root that names every rank: each gathers every input (single copy's all_gather into separate outputs).
EVERY_RANK = -1


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


def single_copy(arena, addr: int, nbytes: int, root: int, outputs, desc: int, lanes: int = 1) -> None:
    """As ``gather``, the root (or every rank: ``EVERY_RANK``) reading every input where it is
    (``_single_copy``), over ``lanes`` of its lanes."""
    sc = arena.single_copy
    outs = np.array(outputs if root in (arena.local_rank, EVERY_RANK) else [], dtype=np.uint64)
    schedule.run(arena, sc, desc, lambda base, resume: sc.gather(base, desc, addr, nbytes, root, outs.ctypes.data,
                                                                 lanes, resume))
