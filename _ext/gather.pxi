# Gather to one root over the arena's slots.
# Textually included by schedules.pyx (after lines.pxi, steps.pxi and allgather.pxi, whose copy_out it uses:
# the root's output is an all-gather's); every function runs without the GIL.


# Every rank's ``nbytes`` at ``addr`` to ``outputs[r]`` (one address per rank) on ``root``; only the root reads
# ``outputs``.
#
# Step base + c + 1 carries chunk c: every rank but the root writes it into its slot and posts; the root posts it
# with nothing written (its own chunk goes straight from its input), waits for every rank, checks at the first
# step that all are in this gather, and copies every chunk out. Only the root reads the slots, and it posts step
# base + c + 1 only once done reading base + c - 1, so a rank may overwrite its slot of that buffer once every rank
# has reached base + c: the wait of the root at chunk c is position c, that of another rank position c - 1 (which
# checks, at base + 1, that all are in this gather too). ``resume`` as in ``chunked``.
cdef Py_ssize_t gather(sched_t *s, uint32_t base, uint64_t desc, const char *addr, Py_ssize_t nbytes, int root,
                        const uintptr_t *outputs, Py_ssize_t resume) noexcept nogil:
    cdef int peer, me = s.me, size = s.size
    cdef Py_ssize_t c = 0 if resume < 0 else (resume if me == root else resume + 1)
    cdef Py_ssize_t start, n
    cdef bint waited = resume >= 0
    cdef uint32_t step
    cdef char *dst
    cdef const char *src
    while c * s.chunk_bytes < nbytes:
        start = c * s.chunk_bytes
        n = s.chunk_bytes if nbytes - start > s.chunk_bytes else nbytes - start
        step = <uint32_t>(base + c + 1)
        if me == root:
            if not waited:
                post_step(s, step, desc)
                if all_reached(s, step) >= 0:
                    return c
            if c == 0 and _first_mismatch(s.lines, 0, size, step, desc) >= 0:
                return STATUS_MISMATCH
            for peer in range(size):
                dst = <char *>outputs[peer] + start
                src = addr + start if peer == me else slot(s, step, peer)
                if dst != src:
                    copy_out(s, nbytes, dst, src, n)
        else:
            if c > 0:
                if not waited and all_reached(s, step - 1) >= 0:
                    return c - 1
                if c == 1 and _first_mismatch(s.lines, 0, size, step - 1, desc) >= 0:
                    return STATUS_MISMATCH
            memcpy(slot(s, step, me), addr + start, n)
            post_step(s, step, desc)
        waited = 0
        c += 1
    return STATUS_DONE
