"""All-to-all: rank r's block j goes to rank j, with per-pair sizes in bytes.

Each slot is split into L *lanes* of ``chunk_bytes / L``; per step rank r puts
the next piece of its block for rank j in lane j of its slot, and rank j reads
lane j of every slot. When sizes differ between pairs, a first step exchanges
every rank's send and receive sizes, so all ranks agree on the number of
steps and all detect the same inconsistency.
"""
import numpy as np

from shmcoll._copy import copy


def alltoall(arena, send, recv, desc: int, uniform: bool) -> None:
    """``send``/``recv``: one (address, nbytes) per local rank; recv[j] is what rank j sends us."""
    me, size = arena.local_rank, arena.local_size
    lane = arena.chunk_bytes // size // 64 * 64
    if uniform:
        longest = send[0][1]
    else:
        step = arena.begin_write()
        buf = step & 1
        sizes = np.array([n for _, n in send] + [n for _, n in recv], dtype=np.int64)
        copy(arena.slot(buf, me), sizes.ctypes.data, sizes.nbytes)
        arena.post(step, desc)
        arena.wait_all(step)
        arena.check_same_collective(step, desc)
        table = arena.rows(buf, np.int64)[:, :2 * size]
        sends, recvs = table[:, :size], table[:, size:].T  # sends[a, b] and recvs[a, b]: bytes from a to b
        bad = np.argwhere(sends != recvs)
        if len(bad):
            a, b = (int(x) for x in bad[0])
            raise ValueError(f"all_to_all split sizes disagree: rank {arena.ranks[a]} sends {int(sends[a, b])} "
                             f"bytes to rank {arena.ranks[b]}, which expects {int(recvs[a, b])} bytes from it")
        longest = int(sends.max())
    copy(recv[me][0], send[me][0], send[me][1])
    first = True
    for start in range(0, longest, lane):
        step = arena.begin_write()
        buf = step & 1
        slot = arena.slot(buf, me)
        for peer in range(size):
            addr, nbytes = send[peer]
            if peer != me and start < nbytes:
                copy(slot + peer * lane, addr + start, min(lane, nbytes - start))
        arena.post(step, desc)
        arena.wait_all(step)
        if first and uniform:
            arena.check_same_collective(step, desc)
        first = False
        for peer in range(size):
            addr, nbytes = recv[peer]
            if peer != me and start < nbytes:
                copy(addr + start, arena.slot(buf, peer) + me * lane, min(lane, nbytes - start))
