# The step primitives every copy-path schedule uses, over one sched_t (schedule.pxd).
# Textually included by schedules.pyx, after lines.pxi.


cdef inline void post_step(sched_t *s, uint32_t step, uint64_t desc) noexcept nogil:
    _post(s.lines, s.me, step, desc)
    s.posted = step


cdef inline int all_reached(sched_t *s, uint32_t step) noexcept nogil:
    """-1 once every rank has reached ``step``; else the first rank still behind when the slice ended."""
    cdef int behind = _wait_ranks(s.lines, 0, s.size, s.me, step, s.spin_ns, s.yield_ns, s.slice_ns,
                                  s.yield_company)
    if behind < 0:
        s.reached = step
    return behind


cdef inline char *slot(sched_t *s, uint32_t step, int rank) noexcept nogil:
    """Start of ``rank``'s slot in the buffer step ``step`` uses."""
    return <char *>(s.data + (step & 1) * s.buffer_bytes + rank * s.stride)
