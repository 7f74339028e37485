# Scatter from one root over the arena's slots.
# Textually included by schedules.pyx (after lines.pxi and steps.pxi); every function runs without the GIL.


# ``nbytes`` from ``inputs[r]`` (one address per rank) on ``root`` to ``out`` on rank r; only the root reads
# ``inputs``.
#
# Step base + c + 1 carries chunk c: the root writes every other rank's chunk into that rank's slot, posts, and
# copies its own chunk straight from its input; every other rank posts the step with nothing written ("done
# reading earlier steps"), waits for the root, checks at the first step that the root is in this scatter, and
# copies its chunk out of its slot. The root may overwrite the slots of step base + c + 1 once every rank has
# reached base + c: its wait at chunk c is position c - 1 (which checks, at base + 1, that all are in this
# scatter), that of another rank (for the root) position c. ``resume`` as in ``chunked``.
cdef Py_ssize_t scatter(sched_t *s, uint32_t base, uint64_t desc, const uintptr_t *inputs, Py_ssize_t nbytes,
                         int root, char *out, Py_ssize_t resume) noexcept nogil:
    cdef int peer, me = s.me, size = s.size
    cdef Py_ssize_t c = 0 if resume < 0 else (resume + 1 if me == root else resume)
    cdef Py_ssize_t start, n
    cdef bint waited = resume >= 0
    cdef uint32_t step
    while c * s.chunk_bytes < nbytes:
        start = c * s.chunk_bytes
        n = s.chunk_bytes if nbytes - start > s.chunk_bytes else nbytes - start
        step = <uint32_t>(base + c + 1)
        if me == root:
            if c > 0:
                if not waited and all_reached(s, step - 1) >= 0:
                    return c - 1
                if c == 1 and _first_mismatch(s.lines, 0, size, step - 1, desc) >= 0:
                    return STATUS_MISMATCH
            for peer in range(size):
                if peer != me:
                    memcpy(slot(s, step, peer), <const char *>inputs[peer] + start, n)
            post_step(s, step, desc)
            if out + start != <const char *>inputs[me] + start:
                memcpy(out + start, <const char *>inputs[me] + start, n)
        else:
            if not waited:
                post_step(s, step, desc)
                if root_reached(s, root, step) >= 0:
                    return c
            if c == 0 and _first_mismatch(s.lines, root, root + 1, step, desc) >= 0:
                return STATUS_MISMATCH
            memcpy(out + start, slot(s, step, me), n)
        waited = 0
        c += 1
    return STATUS_DONE
