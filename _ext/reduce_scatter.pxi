# Reduce-scatter over the arena's slots.
# Textually included by schedules.pyx (after lines.pxi and steps.pxi); every function runs without the GIL.


# Reduce block r of the L blocks of ``block_count`` elements at ``addr`` into rank r's ``out``. Block k starts
# ``k * block_stride`` elements after ``addr`` (``block_count`` unless a lane handles one stretch of every
# block).
#
# Step base + c + 1 publishes piece c of every block (L pieces side by side in our slot); we then reduce piece c
# of our block from every slot, in rank order, into scratch and copy it out (scratch, not ``out`` directly:
# ``out`` may overlap input pieces of later steps). Wait position c waits for step base + c + 1; ``resume`` as
# in ``chunked``.
cdef Py_ssize_t reduce_scatter(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t block_count,
                                Py_ssize_t block_stride, int itemsize, char *out, kernel_t kernel, int64_t op,
                                double scale, Py_ssize_t resume) noexcept nogil:
    cdef Py_ssize_t piece = s.chunk_bytes // (s.size * itemsize)
    cdef Py_ssize_t c = 0 if resume < 0 else resume
    cdef Py_ssize_t start, n, k
    cdef uint32_t step
    cdef int me = s.me, size = s.size
    cdef char *mine
    while c * piece < block_count:
        start = c * piece
        n = piece if block_count - start > piece else block_count - start
        step = <uint32_t>(base + c + 1)
        if resume != c:
            mine = slot(s, step, me)
            for k in range(size):
                memcpy(mine + k * n * itemsize, addr + (k * block_stride + start) * itemsize, n * itemsize)
            post_step(s, step, desc)
            if all_reached(s, step) >= 0:
                return c
        if c == 0 and _first_mismatch(s.lines, 0, size, step, desc) >= 0:
            return STATUS_MISMATCH
        kernel(<void *>s.scratch, slot(s, step, 0) + me * n * itemsize,
               slot(s, step, 1) + me * n * itemsize, size - 1, s.stride // itemsize, n, op, scale)
        memcpy(out + start * itemsize, <void *>s.scratch, n * itemsize)
        c += 1
    return STATUS_DONE
