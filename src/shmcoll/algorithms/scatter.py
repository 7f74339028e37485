"""Scatter from one root: per step the root fills every rank's slot with that rank's next piece."""
from shmcoll._copy import copy


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
