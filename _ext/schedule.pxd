# Declarations shared by the C schedules (schedules.pyx and its .pxi files, single_copy.pyx, and sync.pyx's
# waits through lines.pxi): the control line's layout, the kernels' type, the status codes a schedule
# returns, and one rank's constants and step bookkeeping over one set of control lines (the arena's own, or
# one lane's). Step numbers are uint32 words in C, so their arithmetic wraps by itself (Python masks them:
# waits.STEP_MASK).
from libc.stdint cimport uint32_t, uint64_t, int64_t, uintptr_t

# A control line (one per rank, 128 bytes): the step word (uint32) at 0, the count of its sleepers at 4,
# four descriptor slots (uint64, step % 4) from 8, the rank's pid (int32) at 48, the CPU it last waited on
# where ranks outnumber cores (uint32) at 52, four buffer-address slots (uint64, step % 4; single copy)
# from 56 to 88, and the rank's standing in the group (uint32) at 88: 0 while it takes part, 1 once it gave up
# mid-collective, 2 once it closed the group (it takes no step again after either; shmcoll.arena says them).
cdef enum:
    _LINE = 128
    _DESC = 8
    _PID = 48
    _CPU = 52
    _ADDRESS = 56
    _STANDING = 88

# A reduction kernel (shmcoll.kernel_abi), called by address without the GIL:
# out = first op rows[0] op ... op rows[nrows - 1], n elements each, rows row_stride elements apart.
ctypedef void (*kernel_t)(void *out, void *first, void *rows, int64_t nrows, int64_t row_stride,
                          int64_t n, int64_t op, double scale) noexcept nogil

# Most lanes a pool has (arena.MAX_LANES, the lanes the arena's layout reserves lines for).
cdef enum:
    MAX_POOL_LANES = 16

# Local work split over a rank's lanes (``pool_for`` of lanes.pxi; single copy's reads and reductions):
# ``task(ctx, lo, hi, lane)`` does part [lo, hi) of the work on lane ``lane``, waiting for no peer.
ctypedef void (*task_t)(void *ctx, Py_ssize_t lo, Py_ssize_t hi, int lane) noexcept nogil
# ``pool_for`` by address (the pool lives in _schedules, single copy in _single_copy): ``task`` over
# [0, ``count``) on ``lanes`` lanes of ``pool``, each part starting at a multiple of ``align``; returns when
# every part is done.
ctypedef void (*pool_for_t)(void *pool, int lanes, task_t task, void *ctx, Py_ssize_t count,
                            Py_ssize_t align) noexcept nogil

# ``pool_start`` by address (the pool lives in _schedules, the compiled front in _front): one collective of
# ``kind`` (shmcoll/_schedules.pxd's KIND_*) over the first ``lanes`` lanes of ``pool``, as ``Pool.start`` runs it; 2 once
# every lane ended DONE, 1 once every lane ended otherwise (``shmcoll.lanes.Lanes.finish`` raises), 0 when a
# wait outlasted its slice (``Lanes.finish`` settles it).
ctypedef int (*pool_start_t)(void *pool, int kind, int lanes, uint64_t desc, uintptr_t addr, uintptr_t out,
                             Py_ssize_t count, Py_ssize_t itemsize, Py_ssize_t align, Py_ssize_t block_stride,
                             Py_ssize_t out_stride, uintptr_t blocks, kernel_t kernel, int64_t op,
                             double scale, int root) noexcept nogil

# What a schedule call returns. A value >= 0 is the position p of a wait whose slice expired: resume from p
# once every rank has reached step base + p + 1 (shmcoll.algorithms.schedule).
cdef enum:
    STATUS_DONE = -1
    STATUS_MISMATCH = -2  # a peer published the first step for another collective
    STATUS_FAILED = -3  # single copy: a read of a peer's buffer failed (its errno and peer are kept)
    STATUS_SIZES = -4  # all_to_all: the size tables disagree
    STATUS_CANCELLED = -5  # a lane stopped because another lane, or the caller, gave up

# One rank's view of one sequence of steps and the buffers it owns.
ctypedef struct sched_t:
    uintptr_t lines  # one control line per local rank (its layout above)
    uintptr_t data  # slot r of buffer b at data + b * buffer_bytes + r * stride
    uintptr_t scratch  # chunk_bytes private to this rank
    int me, size
    Py_ssize_t buffer_bytes, chunk_bytes, stride
    int64_t spin_ns, yield_ns, slice_ns
    int yield_company  # see _wait_ranks (waits.Budgets.company)
    # The last step this rank posted, and the highest it saw every rank reach (after DONE: the arena
    # records them, Steps.record_schedule; a lane starts its next collective from them).
    uint32_t posted, reached
    # The least output per rank an all-gather writes with streaming stores (shmcoll.streaming).
    Py_ssize_t stream_bytes
