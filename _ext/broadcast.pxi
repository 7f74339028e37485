# Broadcast over the arena's slots.
# Textually included by schedules.pyx (after lines.pxi and steps.pxi); every function runs without the GIL.


cdef inline void _spread(sched_t *s, uint32_t step, char *addr, Py_ssize_t n, int into_slots) noexcept nogil:
    """Copy ``n`` bytes at ``addr`` into (or out of) the ``chunk_bytes`` of slot 0, 1, ... of ``step``."""
    cdef int k = 0
    cdef Py_ssize_t part
    while n > 0:
        part = s.chunk_bytes if n > s.chunk_bytes else n
        if into_slots:
            memcpy(slot(s, step, k), addr, part)
        else:
            memcpy(addr, slot(s, step, k), part)
        addr += part
        n -= part
        k += 1


# Copy ``nbytes`` at ``addr`` on ``root`` to ``addr`` on every rank.
#
# Step base + c + 1 carries chunk c: the root fills the ``chunk_bytes`` of every slot (L of them) and posts;
# the others post the same step with nothing written (meaning "done reading earlier steps"), wait for the root
# and copy out. Everyone checks at the first step that all are in the same broadcast (a rank that wrongly
# believes it is the root has written too). Wait position p waits for step base + p + 1; ``resume`` as in
# ``chunked``.
cdef Py_ssize_t broadcast(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t nbytes, int root,
                           Py_ssize_t resume) noexcept nogil:
    cdef Py_ssize_t capacity = s.size * s.chunk_bytes
    cdef Py_ssize_t chunks = (nbytes + capacity - 1) // capacity
    cdef Py_ssize_t c, start, n
    cdef int me = s.me, size = s.size
    cdef uint32_t step
    # Where to pick up: chunk c, and whether its wait is behind us.
    c = 0 if resume < 0 else (resume + 1 if me == root else resume)
    cdef int waited = resume >= 0
    if resume == 0 and _first_mismatch(s.lines, 0, size, <uint32_t>(base + 1), desc) >= 0:
        return STATUS_MISMATCH
    while c < chunks:
        start = c * capacity
        n = capacity if nbytes - start > capacity else nbytes - start
        step = <uint32_t>(base + c + 1)
        if me == root:
            # The buffer of step s is free once every rank reached s - 1 (the caller saw to it for c = 0).
            if c > 0 and not waited and all_reached(s, step - 1) >= 0:
                return c - 1
            _spread(s, step, addr + start, n, 1)
            post_step(s, step, desc)
            waited = 0
            if c == 0:
                if all_reached(s, step) >= 0:
                    return 0
                if _first_mismatch(s.lines, 0, size, step, desc) >= 0:
                    return STATUS_MISMATCH
                waited = 1  # every rank reached step 1: chunk 1's buffer wait is behind us too
        else:
            if not waited:
                post_step(s, step, desc)
                if c == 0:
                    if all_reached(s, step) >= 0:
                        return 0
                    if _first_mismatch(s.lines, 0, size, step, desc) >= 0:
                        return STATUS_MISMATCH
                elif root_reached(s, root, step) >= 0:
                    return c
            _spread(s, step, addr + start, n, 0)
            waited = 0
        c += 1
    return STATUS_DONE
