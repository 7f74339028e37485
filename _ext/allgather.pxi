# All-gather over the arena's slots.
# Textually included by schedules.pyx (after lines.pxi and steps.pxi); every function runs without the GIL.


# Where rank r's block of an all-gather's output starts: ``out + r * out_stride`` for one output tensor, or
# ``out + blocks[r]`` for one tensor per rank (the list form: ``blocks`` holds their addresses and ``out`` is
# 0). A lane adds the offset of its stretch to ``out``.
cdef inline char *block_at(char *out, Py_ssize_t out_stride, const uintptr_t *blocks, int r) noexcept nogil:
    return out + <Py_ssize_t>blocks[r] if blocks != NULL else out + r * out_stride


# Copy ``n`` bytes of an all-gather's output: with streaming stores where its whole output (``size`` blocks of
# ``block_bytes``; a lane copies a stretch of each) reaches ``stream_bytes`` (shmcoll.streaming).
cdef inline void copy_out(sched_t *s, Py_ssize_t block_bytes, char *dst, const char *src, Py_ssize_t n) noexcept nogil:
    if block_bytes * s.size >= s.stream_bytes:
        arch.shmcoll_copy_streaming(dst, src, n)
    else:
        memcpy(dst, src, n)


# Copy every rank's ``nbytes`` at ``addr`` to its block of the output (``block_at``) on every rank;
# ``out_stride`` is also the blocks' span for ``copy_out`` (a list form's block bytes).
#
# Step base + c + 1 publishes chunk c of our input; once everyone has, we copy all L chunks out. Wait position
# c waits for step base + c + 1; ``resume`` as in ``chunked``. Data movement only: no kernel, but the same loop
# in C saves a Python round per chunk.
cdef Py_ssize_t allgather(sched_t *s, uint32_t base, uint64_t desc, char *addr, Py_ssize_t nbytes, char *out,
                           Py_ssize_t out_stride, const uintptr_t *blocks, Py_ssize_t resume) noexcept nogil:
    cdef Py_ssize_t c = 0 if resume < 0 else resume
    cdef Py_ssize_t start, n
    cdef uint32_t step
    cdef int peer, me = s.me, size = s.size
    cdef char *mine = block_at(out, out_stride, blocks, me)
    while c * s.chunk_bytes < nbytes:
        start = c * s.chunk_bytes
        n = s.chunk_bytes if nbytes - start > s.chunk_bytes else nbytes - start
        step = <uint32_t>(base + c + 1)
        if resume != c:
            memcpy(slot(s, step, me), addr + start, n)
            post_step(s, step, desc)
            # Our own block goes straight from the input, still in cache, while the peers
            # catch up, rather than out of the slot after the wait: 1 MiB at 2 ranks went
            # from 88 to 66 us; no change from 16 MiB up, where memory bandwidth bounds it.
            # In place (the input is our block of the output): nothing to copy. Not the first
            # chunk: the output stays as it was until the peers are known to be in this collective.
            if mine != addr and c > 0:
                copy_out(s, out_stride, mine + start, addr + start, n)
            if all_reached(s, step) >= 0:
                return c
        if c == 0:
            if _first_mismatch(s.lines, 0, size, step, desc) >= 0:
                return STATUS_MISMATCH
            if mine != addr:
                copy_out(s, out_stride, mine, addr, n)
        for peer in range(size):
            if peer != me:
                copy_out(s, out_stride, block_at(out, out_stride, blocks, peer) + start, slot(s, step, peer), n)
        c += 1
    return STATUS_DONE
