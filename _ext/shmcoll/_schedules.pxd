# What the compiled front (front.pyx) calls of the copy-path schedules (schedules.pyx) across the two extension
# modules: the Schedule's C state and the schedule functions, called with the GIL released (through function
# pointers that Cython exchanges when a module is imported).
from libc.stdint cimport uint32_t, uint64_t, int64_t, uintptr_t

from schedule cimport kernel_t, sched_t


cdef class Schedule:
    cdef sched_t s


cdef Py_ssize_t one_shot(sched_t *s, uint32_t step, uint64_t desc, char *addr, Py_ssize_t count, int itemsize,
                         kernel_t kernel, int64_t op, double scale, bint resume) noexcept nogil
cdef Py_ssize_t reduce_scatter(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t block_count,
                               Py_ssize_t block_stride, int itemsize, char *out, bint direct, kernel_t kernel,
                               int64_t op, double scale, Py_ssize_t resume) noexcept nogil
cdef Py_ssize_t allgather(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t nbytes, char *out,
                          Py_ssize_t out_stride, Py_ssize_t resume) noexcept nogil
cdef Py_ssize_t broadcast(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t nbytes, int root,
                          Py_ssize_t resume) noexcept nogil
cdef Py_ssize_t barrier(sched_t *s, uint32_t step, uint64_t desc) noexcept nogil


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
