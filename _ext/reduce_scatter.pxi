# Reduce-scatter over the arena's slots.
# Textually included by schedules.pyx (after lines.pxi and steps.pxi); every function runs without the GIL.


# ``apart`` (whether the output overlaps none of the input) is declared with the schedules' functions in
# shmcoll/_schedules.pxd, where the compiled front reads it too.


# Reduce block r of the L blocks of ``block_count`` elements at ``addr`` into rank r's ``out``. Block k starts
# ``k * block_stride`` elements after ``addr`` (``block_count`` unless a lane handles one stretch of every
# block). ``direct``: ``out`` is ``apart`` from the input.
#
# Step base + c + 1 publishes piece c of every block that a peer reduces (L pieces side by side in our slot);
# we then reduce piece c of our block from every slot, in rank order, into ``out`` (or scratch, copied out).
# Our own piece is read where it is, not published, where that keeps rank order (``own_in_place``, as in
# ``chunked``). Wait position c waits for step base + c + 1; ``resume`` as in ``chunked``.
cdef Py_ssize_t reduce_scatter(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t block_count,
                                Py_ssize_t block_stride, int itemsize, char *out, bint direct, kernel_t kernel,
                                int64_t op, double scale, Py_ssize_t resume) noexcept nogil:
    cdef Py_ssize_t piece = s.chunk_bytes // (s.size * itemsize)
    cdef Py_ssize_t c = 0 if resume < 0 else resume
    cdef Py_ssize_t start, n, k
    cdef uint32_t step
    cdef int me = s.me, size = s.size
    cdef bint in_place = own_in_place(s)
    cdef char *mine
    cdef char *own
    cdef char *into
    while c * piece < block_count:
        start = c * piece
        n = piece if block_count - start > piece else block_count - start
        step = <uint32_t>(base + c + 1)
        if resume != c:
            mine = slot(s, step, me)
            for k in range(size):
                if k != me or not in_place:
                    memcpy(mine + k * n * itemsize, addr + (k * block_stride + start) * itemsize, n * itemsize)
            post_step(s, step, desc)
            if all_reached(s, step) >= 0:
                return c
        if c == 0 and _first_mismatch(s.lines, 0, size, step, desc) >= 0:
            return STATUS_MISMATCH
        own = addr + (me * block_stride + start) * itemsize
        into = out + start * itemsize if direct else <char *>s.scratch
        kernel(<void *>into, first_row(s, step, me * n * itemsize, own), other_rows(s, step, me * n * itemsize, own),
               size - 1, s.stride // itemsize, n, op, scale)
        if not direct:
            memcpy(out + start * itemsize, <void *>s.scratch, n * itemsize)
        c += 1
    return STATUS_DONE
