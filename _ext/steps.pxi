# The step primitives every copy-path schedule uses, over one sched_t (schedule.pxd), and the rows a reduction
# reads in rank order, and the one-shot step's reduction of every published slot.
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


cdef inline int root_reached(sched_t *s, int root, uint32_t step) noexcept nogil:
    """-1 once ``root`` has reached ``step``; else ``root``, still behind when the slice ended. Unlike
    ``all_reached`` it records nothing: the other ranks may be behind (a broadcast's or a scatter's ranks wait
    for the root alone)."""
    return _wait_ranks(s.lines, root, root + 1, s.me, step, s.spin_ns, s.yield_ns, s.slice_ns, s.yield_company)


cdef inline char *slot(sched_t *s, uint32_t step, int rank) noexcept nogil:
    """Start of ``rank``'s slot in the buffer step ``step`` uses."""
    return <char *>(s.data + (step & 1) * s.buffer_bytes + rank * s.stride)


# Reductions read every rank's part in rank order (rank 0's first). A rank's own part can stay where it is,
# unpublished, where that keeps the order: at rank 0 it comes first, and with two ranks the other's is the
# only row. ``own_in_place`` decides it; ``first_row`` and ``other_rows`` are then the kernel's ``first`` and
# ``rows`` over the parts at ``offset`` bytes into every rank's slot of ``step``, ours read from ``own``.
cdef inline bint own_in_place(sched_t *s) noexcept nogil:
    return s.me == 0 or s.size == 2


cdef inline char *first_row(sched_t *s, uint32_t step, Py_ssize_t offset, char *own) noexcept nogil:
    return own if s.me == 0 else slot(s, step, 0) + offset


cdef inline char *other_rows(sched_t *s, uint32_t step, Py_ssize_t offset, char *own) noexcept nogil:
    return own if s.me == 1 and s.size == 2 else slot(s, step, 1) + offset


# A one-shot step's reduction: every rank's published slot of ``step`` (``n`` items from ``offset`` bytes into
# each) reduced in rank order into ``out``, which holds our own part. With two ranks ours is read where it is (in
# cache, and not the line the peer is reading); with more, every row from the slots: an output that is one of
# several inputs would take the kernel's slower loops.
cdef inline void reduce_published(sched_t *s, uint32_t step, Py_ssize_t offset, char *out, Py_ssize_t n,
                                  int itemsize, kernel_t kernel, int64_t op, double scale) noexcept nogil:
    if s.size == 2:
        kernel(out, first_row(s, step, offset, out), other_rows(s, step, offset, out), 1, s.stride // itemsize, n,
               op, scale)
    else:
        kernel(out, slot(s, step, 0) + offset, slot(s, step, 1) + offset, s.size - 1, s.stride // itemsize, n, op,
               scale)
