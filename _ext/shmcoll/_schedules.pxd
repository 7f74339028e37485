# What the compiled front (front.pyx) calls of the copy-path schedules (schedules.pyx) across the two extension
# modules: the Schedule's C state and the schedule functions, called with the GIL released (through function
# pointers that Cython exchanges when a module is imported).
from libc.stdint cimport uint32_t, uint64_t, int64_t, uintptr_t

from schedule cimport kernel_t, sched_t


cdef class Schedule:
    cdef sched_t s


cdef Py_ssize_t one_shot(sched_t *s, uint32_t step, uint64_t desc, char *addr, Py_ssize_t count, int itemsize,
                         kernel_t kernel, int64_t op, double scale, bint resume) noexcept nogil
cdef Py_ssize_t one_shot_steps(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t count,
                                int itemsize, kernel_t kernel, int64_t op, double scale,
                                Py_ssize_t resume) noexcept nogil
cdef Py_ssize_t chunked(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t count, int itemsize,
                         kernel_t kernel, int64_t op, double scale, int root, Py_ssize_t resume) noexcept nogil
cdef Py_ssize_t reduce_scatter(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t block_count,
                               Py_ssize_t block_stride, int itemsize, char *out, bint direct, kernel_t kernel,
                               int64_t op, double scale, Py_ssize_t resume) noexcept nogil
cdef Py_ssize_t allgather(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t nbytes, char *out,
                          Py_ssize_t out_stride, const uintptr_t *blocks, Py_ssize_t resume) noexcept nogil
cdef Py_ssize_t broadcast(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t nbytes, int root,
                          Py_ssize_t resume) noexcept nogil
cdef Py_ssize_t gather(sched_t *s, uint32_t base, uint64_t desc, const char *addr, Py_ssize_t nbytes, int root,
                       const uintptr_t *outputs, Py_ssize_t resume) noexcept nogil
cdef Py_ssize_t scatter(sched_t *s, uint32_t base, uint64_t desc, const uintptr_t *inputs, Py_ssize_t nbytes,
                        int root, char *out, Py_ssize_t resume) noexcept nogil
cdef Py_ssize_t alltoall(sched_t *s, uint32_t base, uint64_t desc, const uint64_t *sends, const uint64_t *recvs,
                         const char *tables, Py_ssize_t table_stride, int64_t *agreed,
                         Py_ssize_t resume) noexcept nogil
cdef Py_ssize_t barrier(sched_t *s, uint32_t step, uint64_t desc) noexcept nogil


# What every lane of a collective runs (lanes.pxi), each over its own [lo, hi) of the message; and the one
# all-reduce schedule that never splits, so that an all-reduce's route (``OneNode.allreduce_route``) names its
# schedule by one of these.
cdef enum:
    KIND_ONE_SHOT = 0  # items of ``itemsize``
    KIND_CHUNKED = 1  # all-reduce, or reduce to ``root``
    KIND_REDUCE_SCATTER = 2  # items; the blocks ``block_stride`` items apart
    KIND_ALLGATHER = 3  # bytes; the ranks' blocks of the output ``out_stride`` bytes apart
    KIND_BROADCAST = 4  # bytes, from ``root``
    KIND_TASK = 5  # ``task`` over [lo, hi) (``pool_for``): no schedule, no step, no wait for a peer
    KIND_ONE_SHOT_STEPS = 6  # all-reduce between two ranks in one-shot steps of a slot: the caller's thread only


# Whether a reduce-scatter of the ``size`` blocks of ``count`` items at ``addr`` (``block_stride`` items apart)
# may reduce straight into its output at ``out``: the output overlaps none of the input. Else each piece goes
# through scratch, since the output may hold input pieces of later steps (or, over lanes, of other lanes).
cdef inline bint apart(uintptr_t out, uintptr_t addr, Py_ssize_t count, Py_ssize_t block_stride,
                       Py_ssize_t itemsize, int size) noexcept nogil:
    return out + count * itemsize <= addr or addr + ((size - 1) * block_stride + count) * itemsize <= out


# The arena's (unbounded) number of a 32-bit step at or after ``base`` (0: before it, nothing new).
cdef inline int64_t unwrapped_step(int64_t base, uint32_t step) noexcept nogil:
    cdef uint32_t ahead = step - <uint32_t>base
    return base + ahead if ahead < 0x80000000u else 0
