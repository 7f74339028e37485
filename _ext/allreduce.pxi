# All-reduce and reduce over the arena's slots: one step for small messages, one-shot steps or chunked pairs of
# steps above.
# Textually included by schedules.pyx (after lines.pxi and steps.pxi); every function runs without the GIL.
#
# Every result is reduced in rank order (rank 0's data first), as in shmcoll.kernels, so the one-shot and the
# chunked schedule give bitwise identical results on every rank.


# All-reduce ``count`` elements at ``addr`` (at most one slot) in one step: publish the input, post ``step``,
# wait for everyone, reduce every slot straight into ``addr``. ``resume``: the input is already posted.
# Returns DONE, MISMATCH, or 0 when the wait's slice expired.
cdef Py_ssize_t one_shot(sched_t *s, uint32_t step, uint64_t desc, char *addr, Py_ssize_t count, int itemsize,
                          kernel_t kernel, int64_t op, double scale, bint resume) noexcept nogil:
    if not resume:
        memcpy(slot(s, step, s.me), addr, count * itemsize)
        post_step(s, step, desc)
    if all_reached(s, step) >= 0:
        return 0
    if _first_mismatch(s.lines, 0, s.size, step, desc) >= 0:
        return STATUS_MISMATCH
    reduce_published(s, step, 0, addr, count, itemsize, kernel, op, scale)
    return STATUS_DONE


# All-reduce ``count`` elements at ``addr`` (any size) in one-shot steps of one slot each: step base + c + 1
# publishes chunk c whole, and every rank reduces every rank's slot of it straight into ``addr``. One meeting
# per chunk where ``chunked`` has two; each rank reads every other rank's chunk, so it pays where the ranks are
# few (shmcoll.algorithms.allreduce says where). Writing step base + c + 1's buffer is safe: every rank has
# reached base + c, which it posts only once done reading that buffer at base + c - 1.
#
# Wait position c waits for step base + c + 1; ``resume`` is -1 for a fresh start, or the position returned
# by the previous call once its step has been reached by every rank. Every rank must have reached ``base``.
# Returns DONE, MISMATCH, or the position of the wait that expired.
cdef Py_ssize_t one_shot_steps(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t count,
                                int itemsize, kernel_t kernel, int64_t op, double scale,
                                Py_ssize_t resume) noexcept nogil:
    cdef Py_ssize_t per = s.chunk_bytes // itemsize
    cdef Py_ssize_t c = 0 if resume < 0 else resume
    cdef Py_ssize_t start, n
    cdef uint32_t step
    cdef bint posted = resume >= 0
    while c * per < count:
        start = c * per
        n = per if count - start > per else count - start
        step = <uint32_t>(base + c + 1)
        if not posted:
            memcpy(slot(s, step, s.me), addr + start * itemsize, n * itemsize)
            post_step(s, step, desc)
        posted = False
        if all_reached(s, step) >= 0:
            return c
        if c == 0 and _first_mismatch(s.lines, 0, s.size, step, desc) >= 0:
            return STATUS_MISMATCH
        reduce_published(s, step, 0, addr + start * itemsize, n, itemsize, kernel, op, scale)
        c += 1
    return STATUS_DONE


# All-reduce (``root`` < 0) or reduce to ``root`` of ``count`` elements at ``addr``.
#
# Per chunk c, two steps: base + 2c + 1 publishes the chunk, after which each rank reduces its 1/L share into
# its slot of the other buffer; base + 2c + 2 publishes the shares, which every rank (or only the root)
# gathers into ``addr``. A rank that is not the root leaves after posting its last share. Every rank must
# have reached ``base`` before the call.
#
# Wait positions: 2c waits for step base + 2c + 1, 2c + 1 for base + 2c + 2. ``resume`` is -1 for a fresh
# start, or the position returned by the previous call once its step has been reached by every rank.
# Returns DONE, MISMATCH, or the position of the wait that expired.
cdef Py_ssize_t chunked(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t count, int itemsize,
                         kernel_t kernel, int64_t op, double scale, int root,
                         Py_ssize_t resume) noexcept nogil:
    cdef Py_ssize_t per = s.chunk_bytes // itemsize
    cdef Py_ssize_t chunks = (count + per - 1) // per
    cdef Py_ssize_t c = 0 if resume < 0 else resume // 2
    cdef Py_ssize_t n, lo, hi, plo, phi, start
    cdef uint32_t publish, share
    cdef int me = s.me, size = s.size, peer, behind
    cdef int gathers = root < 0 or root == me
    cdef bint share_in_place = own_in_place(s)  # our share read from addr, not published
    # Where to pick up: 0 publish, 1 reduce, 2 gather. A rank that does not
    # gather waits for a share step only before publishing the next chunk.
    cdef Py_ssize_t stage = 0 if resume < 0 else 1 + resume % 2
    cdef int share_reached = 0
    if resume >= 0 and resume % 2 == 1 and not gathers:
        c, stage, share_reached = resume // 2 + 1, 0, 1
    cdef char *mine
    cdef Py_ssize_t row_stride
    while c < chunks:
        start = c * per
        n = per if count - start > per else count - start
        lo = me * n // size
        hi = (me + 1) * n // size
        publish = <uint32_t>(base + 2 * c + 1)
        share = publish + 1
        mine = addr + start * itemsize
        if stage == 0:
            if c > 0 and not gathers and not share_reached:
                # We skipped waiting for the last share step; the buffer we
                # are about to write is free once every rank has reached it.
                behind = all_reached(s, publish - 1)
                if behind >= 0:
                    return 2 * c - 1
            if share_in_place:
                memcpy(slot(s, publish, me), mine, lo * itemsize)
                memcpy(slot(s, publish, me) + hi * itemsize, mine + hi * itemsize, (n - hi) * itemsize)
            else:
                memcpy(slot(s, publish, me), mine, n * itemsize)
            post_step(s, publish, desc)
            stage, share_reached = 1, 0
            behind = all_reached(s, publish)
            if behind >= 0:
                return 2 * c
        if stage == 1:
            if c == 0 and _first_mismatch(s.lines, 0, size, publish, desc) >= 0:
                return STATUS_MISMATCH
            row_stride = s.stride // itemsize
            kernel(slot(s, share, me) + lo * itemsize, first_row(s, publish, lo * itemsize, mine + lo * itemsize),
                   other_rows(s, publish, lo * itemsize, mine + lo * itemsize), size - 1, row_stride, hi - lo, op,
                   scale)
            post_step(s, share, desc)
            if not gathers:
                stage = 0
                c += 1
                continue
            stage = 2
            behind = all_reached(s, share)
            if behind >= 0:
                return 2 * c + 1
        # stage 2: gather every share of this chunk
        for peer in range(size):
            plo = peer * n // size
            phi = (peer + 1) * n // size
            memcpy(mine + plo * itemsize, slot(s, share, peer) + plo * itemsize, (phi - plo) * itemsize)
        stage = 0
        c += 1
    return STATUS_DONE
