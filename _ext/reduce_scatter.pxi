# Reduce-scatter over the arena's slots.
# Textually included by schedules.pyx (after lines.pxi and steps.pxi); every function runs without the GIL.


# Whether a reduce-scatter may reduce straight into its output (``out_bytes`` at ``out``): the output overlaps
# none of the ``in_bytes`` of input at ``addr``. Else each piece goes through scratch, since the output may hold
# input pieces of later steps (or, over lanes, of other lanes).
cdef inline bint apart(uintptr_t out, Py_ssize_t out_bytes, uintptr_t addr, Py_ssize_t in_bytes) noexcept nogil:
    return out + out_bytes <= addr or addr + in_bytes <= out


# Reduce block r of the L blocks of ``block_count`` elements at ``addr`` into rank r's ``out``. Block k starts
# ``k * block_stride`` elements after ``addr`` (``block_count`` unless a lane handles one stretch of every
# block). ``direct``: ``out`` is ``apart`` from the input.
#
# Step base + c + 1 publishes piece c of every block that a peer reduces (L pieces side by side in our slot);
# we then reduce piece c of our block from every slot, in rank order, into ``out`` (or scratch, copied out).
# Our own piece is read where it is, not published, where that keeps rank order (as in ``chunked``): at rank 0
# it comes first, and with two ranks the peer's is the only row. Wait position c waits for step base + c + 1;
# ``resume`` as in ``chunked``.
cdef Py_ssize_t reduce_scatter(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t block_count,
                                Py_ssize_t block_stride, int itemsize, char *out, bint direct, kernel_t kernel,
                                int64_t op, double scale, Py_ssize_t resume) noexcept nogil:
    cdef Py_ssize_t piece = s.chunk_bytes // (s.size * itemsize)
    cdef Py_ssize_t c = 0 if resume < 0 else resume
    cdef Py_ssize_t start, n, k
    cdef uint32_t step
    cdef int me = s.me, size = s.size
    cdef bint own_in_place = me == 0 or size == 2
    cdef char *mine
    cdef char *own
    cdef char *first
    cdef char *rows
    cdef char *into
    while c * piece < block_count:
        start = c * piece
        n = piece if block_count - start > piece else block_count - start
        step = <uint32_t>(base + c + 1)
        if resume != c:
            mine = slot(s, step, me)
            for k in range(size):
                if k != me or not own_in_place:
                    memcpy(mine + k * n * itemsize, addr + (k * block_stride + start) * itemsize, n * itemsize)
            post_step(s, step, desc)
            if all_reached(s, step) >= 0:
                return c
        if c == 0 and _first_mismatch(s.lines, 0, size, step, desc) >= 0:
            return STATUS_MISMATCH
        own = addr + (me * block_stride + start) * itemsize
        if me == 0:
            first, rows = own, slot(s, step, 1) + me * n * itemsize
        elif own_in_place:  # two ranks, we are rank 1
            first, rows = slot(s, step, 0) + me * n * itemsize, own
        else:
            first, rows = slot(s, step, 0) + me * n * itemsize, slot(s, step, 1) + me * n * itemsize
        into = out + start * itemsize if direct else <char *>s.scratch
        kernel(<void *>into, first, rows, size - 1, s.stride // itemsize, n, op, scale)
        if not direct:
            memcpy(out + start * itemsize, <void *>s.scratch, n * itemsize)
        c += 1
    return STATUS_DONE
