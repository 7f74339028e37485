"""All-to-all: rank r's block j goes to rank j, with per-pair sizes in bytes.

Every rank's sizes are its own arguments (split sizes, tensor sizes), and ranks
may describe the same layout differently (one passes split sizes, another
none), so no rank can pick a plan from its arguments alone. The first step
therefore carries a *size table* beside each slot (``_ext/size_tables.pxi``):
what the rank sends to and expects from every rank. Every rank reads every table
after that step, so all agree on the number of steps and all detect the same
inconsistency, without a step of its own: the first pieces of data travel
with the tables. The schedule runs in C (``_ext/alltoall.pxi``): each slot is
cut into one part per peer, and a step carries the next piece of every block.
"""
from array import array

from shmcoll import _schedules
from shmcoll.algorithms import schedule
from shmcoll.errors import SizesDisagreeError


def alltoall(arena, send, recv, desc: int, flag: int = 0) -> int:
    """``send``/``recv``: one (address, nbytes) per local rank; recv[j] is what rank j sends us.

    ``flag`` rides in the size table too; returns the largest any local rank gave (a word the node's
    ranks exchange for free: the plans across nodes say with it whether a rank's sizes changed)."""
    sends, recvs = _pairs(send), _pairs(recv)
    agreed = array("q", (0, 0))  # the longest block and the largest flag, from the first step's tables
    buf, tables = _write_table(arena, sends, recvs, flag)
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


def _write_table(arena, sends: array, recvs: array, flag: int):
    """This rank's row of the size tables in the buffer of the schedule's first step: (that buffer, its tables)."""
    buf = arena.begin_write() & 1
    tables = arena.tables(buf)
    _schedules.write_size_table(tables.ctypes.data, tables.strides[0], arena.local_rank, arena.local_size,
                                sends.buffer_info()[0], recvs.buffer_info()[0], flag)
    return buf, tables


def single_copy(arena, send, recv, desc: int, lanes: int = 1) -> None:
    """As ``alltoall``, every rank reading its blocks where they are in the senders' inputs (``_single_copy``),
    over ``lanes`` of its lanes: the size tables of the schedule's first step say whether the sizes agree, as
    there, before a byte moves.
    No rank's output may overlap its own input (its peers read that input while it writes the output)."""
    sc = arena.single_copy
    sends, recvs = _pairs(send), _pairs(recv)
    buf, tables = _write_table(arena, sends, recvs, 0)
    schedule.run(arena, sc, desc,
                 lambda base, resume: sc.alltoall(base, desc, sends.buffer_info()[0], recvs.buffer_info()[0],
                                                  tables.ctypes.data, tables.strides[0], lanes, resume),
                 sizes_error=lambda: sizes_error(arena, buf))


def sizes_error(arena, buf: int) -> Exception:
    """The error of a schedule that found the size tables of ``buf`` disagree (SIZES; every rank reads the same
    tables, so every rank raises the same): the first sender and receiver that disagree, and their sizes."""
    tables = arena.tables(buf)
    found = _schedules.first_size_disagreement(tables.ctypes.data, tables.strides[0], arena.local_size)
    if found is None:
        return AssertionError("an all_to_all schedule saw size tables that disagree, which agree when read again")
    sender, receiver, sent, expected = found
    return SizesDisagreeError(arena.ranks[sender], arena.ranks[receiver], sent, expected)
