# All-to-all over the arena's slots: rank r's block for rank j goes to rank j, with per-pair sizes in bytes.
# Textually included by schedules.pyx (after lines.pxi, steps.pxi and size_tables.pxi); every function runs without
# the GIL.
#
# Every rank's sizes are its own arguments, so no rank can plan alone: before the schedule each rank writes its
# row of the size tables (size_tables.pxi) beside its slot of step base + 1's buffer. After that step every rank
# reads every row, so all agree on the number of steps and all see the same disagreement (STATUS_SIZES) without a
# step of its own: the first pieces of data travel with the tables.


# Each slot is cut into L - 1 parts, one per peer: rank r puts its pieces for rank j in part (j - r - 1) mod L,
# so with two ranks a piece fills the slot.
cdef inline Py_ssize_t part_bytes(sched_t *s) noexcept nogil:
    return s.chunk_bytes // (s.size - 1 if s.size > 1 else 1) // 64 * 64


cdef inline Py_ssize_t part_index(int sender, int receiver, int size) noexcept nogil:
    return (receiver - sender - 1 + size) % size


# Copy ``n`` bytes of an all-to-all's output: with streaming stores where this rank's whole output (what it
# receives, ``out_bytes``) reaches ``stream_bytes``, as an all-gather's (allgather.pxi; shmcoll.streaming). Each
# rank decides for its own output: no peer reads it.
cdef inline void receive(sched_t *s, Py_ssize_t out_bytes, char *dst, const char *src, Py_ssize_t n) noexcept nogil:
    if out_bytes >= s.stream_bytes:
        arch.shmcoll_copy_streaming(dst, src, n)
    else:
        memcpy(dst, src, n)


# ``sends``/``recvs``: (address, bytes) per local rank, uint64 pairs; recvs[j] is where what rank j sends us goes.
# ``tables``: step base + 1's size tables, written by every rank before the call. ``agreed`` (two int64 words the
# caller keeps until DONE) gets, once the first step is read, the longest block and the largest flag any rank wrote
# after its sizes: a resumed call reads the first from there, since by then a peer that finished may have begun
# its next all-to-all and rewritten its table.
#
# Step base + c + 1 carries piece c (``part_bytes`` from c * part_bytes) of every block: each rank writes its
# pieces into its slot and posts; once every rank has, each copies its pieces out of the peers' slots. Our own
# block is copied after the first step, once the sizes are known to agree. Wait position p waits for step
# base + p + 1; ``resume`` as in ``chunked``.
cdef Py_ssize_t alltoall(sched_t *s, uint32_t base, uint64_t desc, const uint64_t *sends, const uint64_t *recvs,
                          const char *tables, Py_ssize_t table_stride, int64_t *agreed,
                          Py_ssize_t resume) noexcept nogil:
    cdef Py_ssize_t part = part_bytes(s)
    cdef Py_ssize_t c = 0 if resume < 0 else resume
    cdef Py_ssize_t longest = -1 if c == 0 else agreed[0]
    cdef Py_ssize_t start, nbytes
    cdef uint32_t step
    cdef int peer, me = s.me, size = s.size
    cdef char *mine
    cdef Py_ssize_t out_bytes = 0
    for peer in range(size):
        out_bytes += <Py_ssize_t>recvs[2 * peer + 1]
    while longest < 0 or c * part < longest:
        start = c * part
        step = <uint32_t>(base + c + 1)
        if resume != c:
            mine = slot(s, step, me)
            for peer in range(size):
                nbytes = <Py_ssize_t>sends[2 * peer + 1]
                if peer != me and start < nbytes:
                    memcpy(mine + part_index(me, peer, size) * part, <char *>sends[2 * peer] + start,
                           part if nbytes - start > part else nbytes - start)
            post_step(s, step, desc)
            if all_reached(s, step) >= 0:
                return c
        if c == 0:
            if _first_mismatch(s.lines, 0, size, step, desc) >= 0:
                return STATUS_MISMATCH
            if size_disagreement(size, tables, table_stride) >= 0:
                return STATUS_SIZES
            longest = agreed[0] = longest_block(size, tables, table_stride)
            agreed[1] = largest_flag(size, tables, table_stride)
            if recvs[2 * me] != sends[2 * me]:
                receive(s, out_bytes, <char *>recvs[2 * me], <char *>sends[2 * me], recvs[2 * me + 1])
        for peer in range(size):
            nbytes = <Py_ssize_t>recvs[2 * peer + 1]
            if peer != me and start < nbytes:
                receive(s, out_bytes, <char *>recvs[2 * peer] + start,
                        slot(s, step, peer) + part_index(peer, me, size) * part,
                        part if nbytes - start > part else nbytes - start)
        c += 1
    return STATUS_DONE
