"""Scatter from one root: per step the root fills every rank's slot with that rank's next piece.

The schedule runs in C (``_ext/scatter.pxi``)."""
from array import array

import numpy as np

from shmcoll.algorithms import schedule


def scatter(arena, inputs, nbytes: int, root: int, out_addr: int, desc: int) -> None:
    """On ``root``, ``inputs`` holds one address per local rank; every rank receives ``nbytes``."""
    ins = array("Q", inputs if arena.local_rank == root else ())
    call = arena.schedule.scatter
    schedule.run(arena, arena.schedule, desc,
                 lambda base, resume: call(base, desc, ins.buffer_info()[0], nbytes, root, out_addr, resume))


def single_copy(arena, inputs, nbytes: int, root: int, out_addr: int, desc: int, lanes: int = 1) -> None:
    """As ``scatter``, every rank reading its block where it is on the root (``_single_copy``), over ``lanes``
    of its lanes."""
    sc = arena.single_copy
    ins = np.array(inputs if arena.local_rank == root else [], dtype=np.uint64)
    schedule.run(arena, sc, desc, lambda base, resume: sc.scatter(base, desc, ins.ctypes.data, nbytes, root,
                                                                  out_addr, lanes, resume))
