"""All-to-all: rank r's block j goes to rank j, with per-pair sizes in bytes.

Every rank's sizes are its own arguments (split sizes, tensor sizes), and ranks
may describe the same layout differently (one passes split sizes, another
none), so no rank can pick a plan from its arguments alone. The first step
therefore carries a *size table* in the arena's table beside each slot: what
the rank sends to and expects from every rank. Every rank reads every table
after that step, so all agree on the number of steps and all detect the same
inconsistency, without a step of its own: the first pieces of data travel
with the tables. The schedule runs in C (``_ext/alltoall.pxi``): each slot is
cut into one part per peer, and a step carries the next piece of every block.
"""
from array import array

import numpy as np

from shmcoll.algorithms import schedule
from shmcoll.errors import SizesDisagreeError


def alltoall(arena, send, recv, desc: int, flag: int = 0) -> int:
    """``send``/``recv``: one (address, nbytes) per local rank; recv[j] is what rank j sends us.

    ``flag`` rides in the size table too; returns the largest any local rank gave (a word the node's
    ranks exchange for free: the plans across nodes say with it whether a rank's sizes changed)."""
    sends, recvs = _pairs(send), _pairs(recv)
    agreed = array("q", (0, 0))  # the longest block and the largest flag, from the first step's tables
    buf, tables = _write_table(arena, send, recv, flag)
    call, table_stride = arena.schedule.alltoall, tables.strides[0]
    addresses = (sends.buffer_info()[0], recvs.buffer_info()[0], tables.ctypes.data, agreed.buffer_info()[0])
    schedule.run(arena, arena.schedule, desc,
                 lambda base, resume: call(base, desc, addresses[0], addresses[1], addresses[2], table_stride,
                                           addresses[3], resume),
                 sizes_error=lambda: sizes_error(arena, buf))
    return agreed[1]


def _pairs(blocks) -> array:
    """(address, bytes) per rank as the C schedules read them: uint64 pairs, one after another."""
    return array("Q", [word for block in blocks for word in block])


def _write_table(arena, send, recv, flag: int):
    """This rank's size table in the buffer of the schedule's first step: (that buffer, its tables)."""
    buf = arena.begin_write() & 1
    tables = arena.tables(buf)
    tables[arena.local_rank] = [n for _, n in send] + [n for _, n in recv] + [flag]
    return buf, tables


def single_copy(arena, send, recv, desc: int, lanes: int = 1) -> None:
    """As ``alltoall``, every rank reading its blocks where they are in the senders' inputs (``_single_copy``),
    over ``lanes`` of its lanes: the size tables of the schedule's first step say whether the sizes agree, as
    there, before a byte moves.
    No rank's output may overlap its own input (its peers read that input while it writes the output)."""
    sc = arena.single_copy
    sends, recvs = _pairs(send), _pairs(recv)
    buf, tables = _write_table(arena, send, recv, 0)
    schedule.run(arena, sc, desc,
                 lambda base, resume: sc.alltoall(base, desc, sends.buffer_info()[0], recvs.buffer_info()[0],
                                                  tables.ctypes.data, tables.strides[0], lanes, resume),
                 sizes_error=lambda: sizes_error(arena, buf))


def sizes_error(arena, buf: int) -> Exception:
    """The error of a schedule that found the size tables of ``buf`` disagree (SIZES; every rank reads the same
    tables, so every rank raises the same): the first sender and receiver that disagree, and their sizes."""
    size = arena.local_size
    table = arena.tables(buf)[:, :2 * size]
    sends, recvs = table[:, :size], table[:, size:].T  # sends[a, b] and recvs[a, b]: bytes from a to b
    if np.array_equal(sends, recvs):
        return AssertionError("an all_to_all schedule saw size tables that disagree, Python's check of them does not")
    a, b = (int(x) for x in np.argwhere(sends != recvs)[0])
    return SizesDisagreeError(arena.ranks[a], arena.ranks[b], int(sends[a, b]), int(recvs[a, b]))
