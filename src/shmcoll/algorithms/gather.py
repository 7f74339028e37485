"""Gather to one root: each step every rank publishes up to a slot of its input; the root copies all out.

The schedule runs in C (``_ext/gather.pxi``)."""
from array import array

import numpy as np

from shmcoll.algorithms import schedule

# A root that names every rank: each gathers every input (single copy's all_gather into separate outputs).
EVERY_RANK = -1


def gather(arena, addr: int, nbytes: int, root: int, outputs, desc: int) -> None:
    """On ``root``, ``outputs`` holds one address per local rank; elsewhere it is ignored."""
    outs = array("Q", outputs if arena.local_rank == root else ())
    call = arena.schedule.gather
    schedule.run(arena, arena.schedule, desc,
                 lambda base, resume: call(base, desc, addr, nbytes, root, outs.buffer_info()[0], resume))


def single_copy(arena, addr: int, nbytes: int, root: int, outputs, desc: int, lanes: int = 1) -> None:
    """As ``gather``, the root (or every rank: ``EVERY_RANK``) reading every input where it is
    (``_single_copy``), over ``lanes`` of its lanes."""
    sc = arena.single_copy
    outs = np.array(outputs if root in (arena.local_rank, EVERY_RANK) else [], dtype=np.uint64)
    schedule.run(arena, sc, desc, lambda base, resume: sc.gather(base, desc, addr, nbytes, root, outs.ctypes.data,
                                                                 lanes, resume))
