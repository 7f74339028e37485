# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The copy-path schedules, run in C from the first copy to the last, and the lanes that split them.

A Python loop around copies, posts, waits and kernel calls costs tens of
microseconds per step: most of an 8-byte all-reduce, a sixth of a large one.
Here one call runs a whole schedule with the GIL released, calling the Numba
reduction kernels by address (``shmcoll.kernel_abi``). One file per collective:

    allreduce.pxi        one_shot (one step), one_shot_steps and chunked (all-reduce, reduce)
    reduce_scatter.pxi   reduce_scatter
    allgather.pxi        allgather
    broadcast.pxi        broadcast
    gather.pxi           gather
    scatter.pxi          scatter
    size_tables.pxi      the size tables an all-to-all's ranks write before it (also single_copy's, front's)
    alltoall.pxi         alltoall
    lanes.pxi            Pool: one collective over several threads of a rank

The compiled front of the small collectives (front.pyx) calls these schedules through shmcoll/_schedules.pxd.

Waits are bounded by the slice like every other wait: when one expires, the
call returns where it stopped (a position >= 0) so that Python can check
deadlines and whether peers are alive (``shmcoll.algorithms.schedule``), then
resumes it from that point.

Every result is reduced in rank order (rank 0's data first), as in
``shmcoll.kernels``, so one-shot and chunked schedules, and any number of
lanes, give bitwise identical results on every rank.
"""
from libc.stdint cimport uint32_t, uint64_t, int64_t, uintptr_t
from libc.string cimport memcpy
from cpython.pyport cimport PY_SSIZE_T_MAX

from schedule cimport (kernel_t, task_t, sched_t, MAX_POOL_LANES, STATUS_DONE, STATUS_MISMATCH, STATUS_FAILED,
                       STATUS_SIZES, STATUS_CANCELLED)

include "lines.pxi"
include "steps.pxi"
include "allreduce.pxi"
include "reduce_scatter.pxi"
include "allgather.pxi"
include "broadcast.pxi"
include "gather.pxi"
include "scatter.pxi"
include "size_tables.pxi"
include "alltoall.pxi"
include "barrier.pxi"

DONE = STATUS_DONE
MISMATCH = STATUS_MISMATCH


def unwrapped(int64_t base, uint32_t step) -> int:
    """``unwrapped_step`` for ``shmcoll.algorithms.schedule``: one definition for both paths."""
    return unwrapped_step(base, step)


cdef class Schedule:
    """One rank's constants for running the schedules over one set of steps (the arena's, or a lane's), and its
    step bookkeeping (``posted``, ``reached``: see sched_t; declared in shmcoll/_schedules.pxd)."""

    def __cinit__(self, uintptr_t lines, int me, int size, uintptr_t data, uintptr_t scratch,
                  Py_ssize_t chunk_bytes, Py_ssize_t stride, int64_t spin_ns, int64_t yield_ns,
                  int yield_company, int64_t slice_ns):
        # ``chunk_bytes`` of each slot are ours, at ``data`` + rank * ``stride`` in each buffer.
        self.s.lines = lines
        self.s.scratch = scratch
        self.s.me = me
        self.s.size = size
        self.s.data = data
        self.s.chunk_bytes = chunk_bytes
        self.s.stride = stride
        self.s.buffer_bytes = size * stride
        self.s.slice_ns = slice_ns
        self.s.posted = 0
        self.s.reached = 0
        self.s.stream_bytes = PY_SSIZE_T_MAX  # no output streamed until set_streaming
        self.set_waits(spin_ns, yield_ns, yield_company)

    def set_waits(self, int64_t spin_ns, int64_t yield_ns, int yield_company):
        """Change the wait budgets of later waits (see Arena.set_waits)."""
        self.s.spin_ns = spin_ns
        self.s.yield_ns = yield_ns
        self.s.yield_company = yield_company

    def set_streaming(self, Py_ssize_t stream_bytes):
        """Let all-gathers whose output per rank is at least ``stream_bytes`` write it with streaming stores
        (``shmcoll.streaming.least_output_bytes``)."""
        self.s.stream_bytes = stream_bytes

    @property
    def posted(self) -> int:
        return self.s.posted

    @property
    def reached(self) -> int:
        return self.s.reached

    @property
    def lines(self) -> int:
        return self.s.lines

    def one_shot(self, uint32_t step, uint64_t desc, uintptr_t addr, Py_ssize_t count, int itemsize,
                 uintptr_t kernel, int64_t op, double scale, bint resume):
        cdef Py_ssize_t status
        with nogil:
            status = one_shot(&self.s, step, desc, <char *>addr, count, itemsize, <kernel_t>kernel, op, scale,
                              resume)
        return status

    def one_shot_steps(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t count, int itemsize,
                       uintptr_t kernel, int64_t op, double scale, Py_ssize_t resume):
        cdef Py_ssize_t status
        with nogil:
            status = one_shot_steps(&self.s, base, desc, <char *>addr, count, itemsize, <kernel_t>kernel, op,
                                    scale, resume)
        return status

    def chunked(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t count, int itemsize,
                uintptr_t kernel, int64_t op, double scale, int root, Py_ssize_t resume):
        cdef Py_ssize_t status
        with nogil:
            status = chunked(&self.s, base, desc, <char *>addr, count, itemsize, <kernel_t>kernel, op, scale,
                             root, resume)
        return status

    def reduce_scatter(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t block_count,
                       Py_ssize_t block_stride, int itemsize, uintptr_t out, uintptr_t kernel, int64_t op,
                       double scale, Py_ssize_t resume):
        cdef Py_ssize_t status
        with nogil:
            status = reduce_scatter(&self.s, base, desc, <char *>addr, block_count, block_stride, itemsize,
                                    <char *>out, apart(out, addr, block_count, block_stride, itemsize, self.s.size),
                                    <kernel_t>kernel, op, scale, resume)
        return status

    def allgather(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, uintptr_t out,
                  Py_ssize_t out_stride, uintptr_t blocks, Py_ssize_t resume):
        """``blocks``: the address of a table of one output address per rank (uint64), or 0 (allgather.pxi)."""
        cdef Py_ssize_t status
        with nogil:
            status = allgather(&self.s, base, desc, <char *>addr, nbytes, <char *>out, out_stride,
                               <const uintptr_t *>blocks, resume)
        return status

    def broadcast(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, int root,
                  Py_ssize_t resume):
        cdef Py_ssize_t status
        with nogil:
            status = broadcast(&self.s, base, desc, <char *>addr, nbytes, root, resume)
        return status

    def gather(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, int root, uintptr_t outputs,
               Py_ssize_t resume):
        """``outputs``: on ``root``, the address of one output address per rank (uint64); elsewhere unread."""
        cdef Py_ssize_t status
        with nogil:
            status = gather(&self.s, base, desc, <const char *>addr, nbytes, root, <const uintptr_t *>outputs,
                            resume)
        return status

    def scatter(self, uint32_t base, uint64_t desc, uintptr_t inputs, Py_ssize_t nbytes, int root, uintptr_t out,
                Py_ssize_t resume):
        """``inputs``: on ``root``, the address of one input address per rank (uint64); elsewhere unread."""
        cdef Py_ssize_t status
        with nogil:
            status = scatter(&self.s, base, desc, <const uintptr_t *>inputs, nbytes, root, <char *>out, resume)
        return status

    def alltoall(self, uint32_t base, uint64_t desc, uintptr_t sends, uintptr_t recvs, uintptr_t tables,
                 Py_ssize_t table_stride, uintptr_t agreed, Py_ssize_t resume):
        """``sends``/``recvs``: addresses of (address, bytes) uint64 pairs per rank; ``tables``: the size tables
        of step base + 1; ``agreed``: two int64 words kept until DONE (alltoall.pxi)."""
        cdef Py_ssize_t status
        with nogil:
            status = alltoall(&self.s, base, desc, <const uint64_t *>sends, <const uint64_t *>recvs,
                              <const char *>tables, table_stride, <int64_t *>agreed, resume)
        return status


def size_table_words(int size) -> int:
    """int64 words of a rank's row of the size tables (size_tables.pxi), for the arena's layout."""
    return size_row_words(size)


def write_size_table(uintptr_t tables, Py_ssize_t table_stride, int rank, int size, uintptr_t sends,
                     uintptr_t recvs, int64_t flag):
    """Rank ``rank``'s row of the size tables at ``tables`` (size_tables.pxi) from its blocks: ``sends``/``recvs``
    the addresses of (address, bytes) uint64 pairs per rank, as ``Schedule.alltoall`` takes them."""
    write_size_row(<int64_t *>(tables + rank * table_stride), size, <const uint64_t *>sends,
                   <const uint64_t *>recvs, flag)


def first_size_disagreement(uintptr_t tables, Py_ssize_t table_stride, int size):
    """(sender, receiver, bytes sent, bytes expected) of the first block of the size tables at ``tables`` whose
    sizes disagree; None where all agree (the check every all-to-all schedule makes)."""
    cdef int found = size_disagreement(size, <const char *>tables, table_stride)
    if found < 0:
        return None
    sender, receiver = divmod(found, size)
    return (sender, receiver, size_row(<const char *>tables, table_stride, sender)[receiver],
            size_row(<const char *>tables, table_stride, receiver)[size + sender])


def combine(uintptr_t kernel, uintptr_t out, uintptr_t first, uintptr_t rows, Py_ssize_t nrows,
            Py_ssize_t row_stride, Py_ssize_t count, int64_t op, double scale):
    """``out`` = ``first`` op rows[0] op ... op rows[nrows - 1], ``count`` elements each, rows
    ``row_stride`` elements apart, with the GIL released: private buffers (the partial results of
    several nodes) reduced by the kernel every schedule calls, in the same order (first, then rows)."""
    with nogil:
        (<kernel_t>kernel)(<void *>out, <void *>first, <void *>rows, nrows, row_stride, count, op, scale)


include "lanes.pxi"
