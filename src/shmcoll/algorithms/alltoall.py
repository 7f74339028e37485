"""All-to-all: rank r's block j goes to rank j, with per-pair sizes in bytes.

Every rank's sizes are its own arguments (split sizes, tensor sizes), and ranks
may describe the same layout differently (one passes split sizes, another
none), so no rank can pick a plan from its arguments alone. The first step
therefore carries a *size table* in the arena's table beside each slot: what
the rank sends to and expects from every rank. Every rank reads every table
after that step, so all agree on the number of steps and all detect the same
inconsistency, without a step of its own: the first pieces of data travel
with the tables.

Each slot is cut into L *parts* of equal width; per step, rank r puts the next
piece of its block for rank j in part j of its slot, and rank j reads part j of
every slot. A block of exactly a part's width takes one step.
"""
import numpy as np

from shmcoll._copy import copy
from shmcoll.algorithms import schedule
from shmcoll.errors import SizesDisagreeError


def alltoall(arena, send, recv, desc: int, flag: int = 0) -> int:
    """``send``/``recv``: one (address, nbytes) per local rank; recv[j] is what rank j sends us.

    ``flag`` rides in the size table too; returns the largest any local rank gave (a word the node's
    ranks exchange for free: the plans across nodes say with it whether a rank's sizes changed)."""
    me, size = arena.local_rank, arena.local_size
    part = arena.chunk_bytes // size // 64 * 64
    start, longest, flags = 0, None, flag
    while longest is None or start < longest:
        step = arena.begin_write()
        buf = step & 1
        slot = arena.slot(buf, me)
        if longest is None:
            arena.tables(buf)[me] = [n for _, n in send] + [n for _, n in recv] + [flag]
        for peer in range(size):
            addr, nbytes = send[peer]
            if peer != me and start < nbytes:
                copy(slot + peer * part, addr + start, min(part, nbytes - start))
        arena.post(step, desc)
        arena.wait_all(step)
        if longest is None:
            arena.check_same_collective(step, desc)
            longest = _agreed_longest(arena, buf)
            flags = int(arena.tables(buf)[:, 2 * size].max())
            copy(recv[me][0], send[me][0], send[me][1])  # only now: the sizes are known to agree
        for peer in range(size):
            addr, nbytes = recv[peer]
            if peer != me and start < nbytes:
                copy(addr + start, arena.slot(buf, peer) + me * part, min(part, nbytes - start))
        start += part
    return flags


def single_copy(arena, send, recv, desc: int, lanes: int = 1) -> None:
    """As ``alltoall``, every rank reading its blocks where they are in the senders' inputs (``_single_copy``),
    over ``lanes`` of its lanes: the size tables of the schedule's first step say whether the sizes agree, as
    there, before a byte moves.
    No rank's output may overlap its own input (its peers read that input while it writes the output)."""
    sc, me = arena.single_copy, arena.local_rank
    sends, recvs = np.array(send, dtype=np.uint64), np.array(recv, dtype=np.uint64)  # (address, bytes) rows
    buf = arena.begin_write() & 1  # the buffer of the schedule's first step, whose table we fill now
    tables = arena.tables(buf)
    tables[me] = [n for _, n in send] + [n for _, n in recv] + [0]
    schedule.run(arena, sc, desc,
                 lambda base, resume: sc.alltoall(base, desc, sends.ctypes.data, recvs.ctypes.data,
                                                  tables.ctypes.data, tables.strides[0], lanes, resume),
                 sizes_error=lambda: _sizes_error(arena, buf))


def _sizes_error(arena, buf: int) -> Exception:
    try:
        _agreed_longest(arena, buf)
    except SizesDisagreeError as error:
        return error
    return AssertionError("the single-copy all_to_all saw size tables that disagree, Python's check of them does not")


def _agreed_longest(arena, buf: int) -> int:
    """The longest block any rank sends, from the size tables every rank posted (the same on every rank);
    raises, on every rank alike, if a rank expects other sizes than its peers send it."""
    size = arena.local_size
    table = arena.tables(buf)[:, :2 * size]
    sends, recvs = table[:, :size], table[:, size:].T  # sends[a, b] and recvs[a, b]: bytes from a to b
    if not np.array_equal(sends, recvs):
        a, b = (int(x) for x in np.argwhere(sends != recvs)[0])
        raise SizesDisagreeError(arena.ranks[a], arena.ranks[b], int(sends[a, b]), int(recvs[a, b]))
    return int(sends.max())
