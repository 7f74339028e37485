"""Scatter from one root: per step the root fills every rank's slot with that rank's next piece."""
import numpy as np

from shmcoll._copy import copy
from shmcoll.algorithms import schedule


def scatter(arena, inputs, nbytes: int, root: int, out_addr: int, desc: int) -> None:
    """On ``root``, ``inputs`` holds one address per local rank; every rank receives ``nbytes``."""
    me, size, chunk = arena.local_rank, arena.local_size, arena.chunk_bytes
    for start in range(0, nbytes, chunk):
        n = min(chunk, nbytes - start)
        if me == root:
            step = arena.begin_write()
            buf = step & 1
            for peer in range(size):
                if peer != me:
                    copy(arena.slot(buf, peer), inputs[peer] + start, n)
            arena.post(step, desc)
            copy(out_addr + start, inputs[me] + start, n)
        else:
            step = arena.next_step()
            arena.post(step, desc)
            arena.wait_rank(root, step)
            if start == 0:
                arena.check_same_collective(step, desc, among=root)
            copy(out_addr + start, arena.slot(step & 1, me), n)


def single_copy(arena, inputs, nbytes: int, root: int, out_addr: int, desc: int, lanes: int = 1) -> None:
    """As ``scatter``, every rank reading its block where it is on the root (``_single_copy``), over ``lanes``
    of its lanes."""
    sc = arena.single_copy
    ins = np.array(inputs if arena.local_rank == root else [], dtype=np.uint64)
    schedule.run(arena, sc, desc, lambda base, resume: sc.scatter(base, desc, ins.ctypes.data, nbytes, root,
                                                                  out_addr, lanes, resume))
