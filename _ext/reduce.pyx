# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""All-reduce and reduce schedules run in C, from the first copy to the last.

A Python loop around copies, posts, waits and kernel calls costs tens of
microseconds per step: most of an 8-byte all-reduce, a sixth of a large one.
Here one call runs a whole schedule with the GIL released, calling the Numba
reduction kernels by address (``shmcoll.kernels.entry_point``).

Waits are bounded by ``slice_ns`` like every other wait: when one expires, the
call returns where it stopped so that Python can check deadlines and whether
peers are alive (``Arena.wait_slow``), then resumes it from that point.

Every result is reduced in rank order (rank 0's data first), as in
``shmcoll.kernels``, so one-shot and chunked schedules give bitwise identical
results on every rank.
"""
from libc.stdint cimport uint32_t, uint64_t, int64_t, uintptr_t
from libc.string cimport memcpy

include "lines.pxi"

ctypedef void (*kernel_t)(void *out, void *first, void *rows, int64_t nrows, int64_t row_stride,
                          int64_t n, int64_t op, double scale) noexcept nogil

# Status codes of Schedule methods; a value >= 0 is the position of a wait
# whose slice expired (resume from it once every rank has reached its step).
cdef enum:
    _DONE = -1
    _MISMATCH = -2  # a peer published the first step for another collective

DONE = _DONE
MISMATCH = _MISMATCH


cdef class Schedule:
    """One rank's constants for running reductions over its arena (made once per arena)."""

    cdef uintptr_t lines, data, scratch
    cdef int me, size
    cdef Py_ssize_t buffer_bytes, chunk_bytes, stride
    cdef int64_t spin_ns, yield_ns, slice_ns
    cdef int yield_company  # see _wait_ranks (waits.Budgets.company)
    # After DONE: the last step this rank posted, and the highest it saw every rank reach (the arena
    # records them: Steps.record_schedule), so no caller recomputes a schedule's step count.
    cdef readonly uint32_t posted, reached

    def __cinit__(self, uintptr_t lines, int me, int size, uintptr_t data, uintptr_t scratch,
                  Py_ssize_t chunk_bytes, Py_ssize_t stride, int64_t spin_ns, int64_t yield_ns,
                  int yield_company, int64_t slice_ns):
        # ``chunk_bytes`` of each slot are ours, at ``data`` + rank * ``stride`` in each buffer:
        # a lane (shmcoll.lanes) uses one stretch of every slot, the whole arena uses all of it.
        self.lines = lines
        self.scratch = scratch
        self.me = me
        self.size = size
        self.data = data
        self.chunk_bytes = chunk_bytes
        self.stride = stride
        self.buffer_bytes = size * stride
        self.slice_ns = slice_ns
        self.set_waits(spin_ns, yield_ns, yield_company)

    def set_waits(self, int64_t spin_ns, int64_t yield_ns, int yield_company):
        """Change the wait budgets of later waits (see Arena.set_waits)."""
        self.spin_ns = spin_ns
        self.yield_ns = yield_ns
        self.yield_company = yield_company

    cdef inline void _post_step(self, uint32_t step, uint64_t desc) noexcept nogil:
        _post(self.lines, self.me, step, desc)
        self.posted = step

    cdef inline int _all_reached(self, uint32_t step) noexcept nogil:
        """-1 once every rank has reached ``step``; else the first rank still behind when the slice ended."""
        cdef int behind = _wait_ranks(self.lines, 0, self.size, self.me, step, self.spin_ns, self.yield_ns,
                                      self.slice_ns, self.yield_company)
        if behind < 0:
            self.reached = step
        return behind

    cdef inline char *slot(self, uint32_t step, int rank) noexcept nogil:
        """Start of ``rank``'s slot in the buffer step ``step`` uses."""
        return <char *>(self.data + (step & 1) * self.buffer_bytes + rank * self.stride)

    def one_shot(self, uint32_t step, uint64_t desc, uintptr_t addr, Py_ssize_t count, int itemsize,
                 uintptr_t kernel, int64_t op, double scale, bint resume):
        """All-reduce ``count`` elements at ``addr`` (at most one slot) in one step.

        Publish the input, post ``step``, wait for everyone, reduce every slot
        straight into ``addr``. ``resume``: the input is already posted.
        Returns DONE, MISMATCH, or 0 when the wait's slice expired.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._one_shot(step, desc, <char *>addr, count, itemsize, <kernel_t>kernel, op, scale, resume)
        return status

    cdef Py_ssize_t _one_shot(self, uint32_t step, uint64_t desc, char *addr, Py_ssize_t count, int itemsize,
                              kernel_t kernel, int64_t op, double scale, bint resume) noexcept nogil:
        if not resume:
            memcpy(self.slot(step, self.me), addr, count * itemsize)
            self._post_step(step, desc)
        if self._all_reached(step) >= 0:
            return 0
        if _first_mismatch(self.lines, 0, self.size, step, desc) >= 0:
            return _MISMATCH
        kernel(addr, self.slot(step, 0), self.slot(step, 1), self.size - 1, self.stride // itemsize,
               count, op, scale)
        return _DONE

    def chunked(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t count, int itemsize,
                uintptr_t kernel, int64_t op, double scale, int root, Py_ssize_t resume):
        """All-reduce (``root`` < 0) or reduce to ``root`` of ``count`` elements at ``addr``.

        Per chunk c, two steps: base + 2c + 1 publishes the chunk, after which
        each rank reduces its 1/L share into its slot of the other buffer;
        base + 2c + 2 publishes the shares, which every rank (or only the root)
        gathers into ``addr``. A rank that is not the root leaves after posting
        its last share. Every rank must have reached ``base`` before the call.

        Wait positions: 2c waits for step base + 2c + 1, 2c + 1 for base + 2c + 2.
        ``resume`` is -1 for a fresh start, or the position returned by the
        previous call once its step has been reached by every rank.
        Returns DONE, MISMATCH, or the position of the wait that expired.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._chunked(base, desc, <char *>addr, count, itemsize, <kernel_t>kernel, op, scale,
                                   root, resume)
        return status

    cdef Py_ssize_t _chunked(self, uint32_t base, uint64_t desc, char *addr, Py_ssize_t count, int itemsize,
                             kernel_t kernel, int64_t op, double scale, int root,
                             Py_ssize_t resume) noexcept nogil:
        cdef Py_ssize_t per = self.chunk_bytes // itemsize
        cdef Py_ssize_t chunks = (count + per - 1) // per
        cdef Py_ssize_t c = 0 if resume < 0 else resume // 2
        cdef Py_ssize_t n, lo, hi, plo, phi, start
        cdef uint32_t publish, share
        cdef int me = self.me, size = self.size, peer, behind
        cdef int gathers = root < 0 or root == me
        # The own share can be read in place from addr (not published) when that
        # keeps rank order: rank 0's data comes first, and with two ranks the
        # other's is the only row.
        cdef int share_in_place = me == 0 or size == 2
        # Where to pick up: 0 publish, 1 reduce, 2 gather. A rank that does not
        # gather waits for a share step only before publishing the next chunk.
        cdef Py_ssize_t stage = 0 if resume < 0 else 1 + resume % 2
        cdef int share_reached = 0
        if resume >= 0 and resume % 2 == 1 and not gathers:
            c, stage, share_reached = resume // 2 + 1, 0, 1
        cdef char *mine
        cdef char *first
        cdef char *rows
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
                    behind = self._all_reached(publish - 1)
                    if behind >= 0:
                        return 2 * c - 1
                if share_in_place:
                    memcpy(self.slot(publish, me), mine, lo * itemsize)
                    memcpy(self.slot(publish, me) + hi * itemsize, mine + hi * itemsize, (n - hi) * itemsize)
                else:
                    memcpy(self.slot(publish, me), mine, n * itemsize)
                self._post_step(publish, desc)
                stage, share_reached = 1, 0
                behind = self._all_reached(publish)
                if behind >= 0:
                    return 2 * c
            if stage == 1:
                if c == 0 and _first_mismatch(self.lines, 0, size, publish, desc) >= 0:
                    return _MISMATCH
                row_stride = self.stride // itemsize
                if me == 0:
                    first, rows = mine + lo * itemsize, self.slot(publish, 1) + lo * itemsize
                elif share_in_place:  # two ranks, we are rank 1
                    first, rows = self.slot(publish, 0) + lo * itemsize, mine + lo * itemsize
                else:
                    first, rows = self.slot(publish, 0) + lo * itemsize, self.slot(publish, 1) + lo * itemsize
                kernel(self.slot(share, me) + lo * itemsize, first, rows, size - 1, row_stride, hi - lo, op, scale)
                self._post_step(share, desc)
                if not gathers:
                    stage = 0
                    c += 1
                    continue
                stage = 2
                behind = self._all_reached(share)
                if behind >= 0:
                    return 2 * c + 1
            # stage 2: gather every share of this chunk
            for peer in range(size):
                plo = peer * n // size
                phi = (peer + 1) * n // size
                memcpy(mine + plo * itemsize, self.slot(share, peer) + plo * itemsize, (phi - plo) * itemsize)
            stage = 0
            c += 1
        return _DONE

    def reduce_scatter(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t block_count,
                       Py_ssize_t block_stride, int itemsize, uintptr_t out, uintptr_t kernel, int64_t op,
                       double scale, Py_ssize_t resume):
        """Reduce block r of the L blocks of ``block_count`` elements at ``addr`` into rank r's ``out``.

        Block k starts ``k * block_stride`` elements after ``addr`` (``block_count``
        unless a lane handles one stretch of every block).

        Step base + c + 1 publishes piece c of every block (L pieces side by
        side in our slot); we then reduce piece c of our block from every slot,
        in rank order, into scratch and copy it out (scratch, not ``out``
        directly: ``out`` may overlap input pieces of later steps).
        Wait position c waits for step base + c + 1; ``resume`` as in ``chunked``.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._reduce_scatter(base, desc, <char *>addr, block_count, block_stride, itemsize,
                                          <char *>out, <kernel_t>kernel, op, scale, resume)
        return status

    cdef Py_ssize_t _reduce_scatter(self, uint32_t base, uint64_t desc, char *addr, Py_ssize_t block_count,
                                    Py_ssize_t block_stride, int itemsize, char *out, kernel_t kernel, int64_t op,
                                    double scale, Py_ssize_t resume) noexcept nogil:
        cdef Py_ssize_t piece = self.chunk_bytes // (self.size * itemsize)
        cdef Py_ssize_t c = 0 if resume < 0 else resume
        cdef Py_ssize_t start, n, k
        cdef uint32_t step
        cdef int me = self.me, size = self.size
        cdef char *slot
        while c * piece < block_count:
            start = c * piece
            n = piece if block_count - start > piece else block_count - start
            step = <uint32_t>(base + c + 1)
            if resume != c:
                slot = self.slot(step, me)
                for k in range(size):
                    memcpy(slot + k * n * itemsize, addr + (k * block_stride + start) * itemsize, n * itemsize)
                self._post_step(step, desc)
                if self._all_reached(step) >= 0:
                    return c
            if c == 0 and _first_mismatch(self.lines, 0, size, step, desc) >= 0:
                return _MISMATCH
            kernel(<void *>self.scratch, self.slot(step, 0) + me * n * itemsize,
                   self.slot(step, 1) + me * n * itemsize, size - 1, self.stride // itemsize, n, op, scale)
            memcpy(out + start * itemsize, <void *>self.scratch, n * itemsize)
            c += 1
        return _DONE

    def allgather(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, uintptr_t out,
                  Py_ssize_t out_stride, Py_ssize_t resume):
        """Copy every rank's ``nbytes`` at ``addr`` to ``out + rank * out_stride`` on every rank.

        Step base + c + 1 publishes chunk c of our input; once everyone has, we
        copy all L chunks out. Wait position c waits for step base + c + 1;
        ``resume`` as in ``chunked``. Data movement only: no kernel, but the
        same loop in C saves a Python round per chunk.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._allgather(base, desc, <char *>addr, nbytes, <char *>out, out_stride, resume)
        return status

    cdef Py_ssize_t _allgather(self, uint32_t base, uint64_t desc, char *addr, Py_ssize_t nbytes, char *out,
                               Py_ssize_t out_stride, Py_ssize_t resume) noexcept nogil:
        cdef Py_ssize_t c = 0 if resume < 0 else resume
        cdef Py_ssize_t start, n
        cdef uint32_t step
        cdef int peer, me = self.me, size = self.size
        cdef char *mine = out + me * out_stride
        while c * self.chunk_bytes < nbytes:
            start = c * self.chunk_bytes
            n = self.chunk_bytes if nbytes - start > self.chunk_bytes else nbytes - start
            step = <uint32_t>(base + c + 1)
            if resume != c:
                memcpy(self.slot(step, me), addr + start, n)
                self._post_step(step, desc)
                # Our own block goes straight from the input, still in cache, while the peers
                # catch up, rather than out of the slot after the wait: 1 MiB at 2 ranks went
                # from 88 to 66 us; no change from 16 MiB up, where memory bandwidth bounds it.
                # In place (the input is our block of the output): nothing to copy.
                if mine != addr:
                    memcpy(mine + start, addr + start, n)
                if self._all_reached(step) >= 0:
                    return c
            if c == 0 and _first_mismatch(self.lines, 0, size, step, desc) >= 0:
                return _MISMATCH
            for peer in range(size):
                if peer != me:
                    memcpy(out + peer * out_stride + start, self.slot(step, peer), n)
            c += 1
        return _DONE

    def broadcast(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, int root,
                  Py_ssize_t resume):
        """Copy ``nbytes`` at ``addr`` on ``root`` to ``addr`` on every rank.

        Step base + c + 1 carries chunk c: the root fills the ``chunk_bytes`` of
        every slot (L of them) and posts; the others post the same step with
        nothing written (meaning "done reading earlier steps"), wait for the
        root and copy out. Everyone checks at the first step that all are in the
        same broadcast (a rank that wrongly believes it is the root has written too).
        Wait position p waits for step base + p + 1; ``resume`` as in ``chunked``.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._broadcast(base, desc, <char *>addr, nbytes, root, resume)
        return status

    cdef Py_ssize_t _broadcast(self, uint32_t base, uint64_t desc, char *addr, Py_ssize_t nbytes, int root,
                               Py_ssize_t resume) noexcept nogil:
        cdef Py_ssize_t capacity = self.size * self.chunk_bytes
        cdef Py_ssize_t chunks = (nbytes + capacity - 1) // capacity
        cdef Py_ssize_t c, start, n
        cdef int me = self.me, size = self.size
        cdef uint32_t step
        # Where to pick up: chunk c, and whether its wait is behind us.
        c = 0 if resume < 0 else (resume + 1 if me == root else resume)
        cdef int waited = resume >= 0
        if resume == 0 and _first_mismatch(self.lines, 0, size, <uint32_t>(base + 1), desc) >= 0:
            return _MISMATCH
        while c < chunks:
            start = c * capacity
            n = capacity if nbytes - start > capacity else nbytes - start
            step = <uint32_t>(base + c + 1)
            if me == root:
                # The buffer of step s is free once every rank reached s - 1 (run() saw to it for c = 0).
                if c > 0 and not waited and self._all_reached(step - 1) >= 0:
                    return c - 1
                self._spread(step, addr + start, n, 1)
                self._post_step(step, desc)
                waited = 0
                if c == 0:
                    if self._all_reached(step) >= 0:
                        return 0
                    if _first_mismatch(self.lines, 0, size, step, desc) >= 0:
                        return _MISMATCH
                    waited = 1  # every rank reached step 1: chunk 1's buffer wait is behind us too
            else:
                if not waited:
                    self._post_step(step, desc)
                    if c == 0:
                        if self._all_reached(step) >= 0:
                            return 0
                        if _first_mismatch(self.lines, 0, size, step, desc) >= 0:
                            return _MISMATCH
                    elif _wait_ranks(self.lines, root, root + 1, me, step, self.spin_ns, self.yield_ns,
                                     self.slice_ns, self.yield_company) >= 0:
                        return c
                self._spread(step, addr + start, n, 0)
                waited = 0
            c += 1
        return _DONE

    cdef inline void _spread(self, uint32_t step, char *addr, Py_ssize_t n, int into_slots) noexcept nogil:
        """Copy ``n`` bytes at ``addr`` into (or out of) the ``chunk_bytes`` of slot 0, 1, ... of ``step``."""
        cdef int k = 0
        cdef Py_ssize_t part
        while n > 0:
            part = self.chunk_bytes if n > self.chunk_bytes else n
            if into_slots:
                memcpy(self.slot(step, k), addr, part)
            else:
                memcpy(addr, self.slot(step, k), part)
            addr += part
            n -= part
            k += 1


def combine(uintptr_t kernel, uintptr_t out, uintptr_t first, uintptr_t rows, Py_ssize_t nrows,
            Py_ssize_t row_stride, Py_ssize_t count, int64_t op, double scale):
    """``out`` = ``first`` op rows[0] op ... op rows[nrows - 1], ``count`` elements each, rows
    ``row_stride`` elements apart, with the GIL released: private buffers (the partial results of
    several nodes) reduced by the kernel every schedule calls, in the same order (first, then rows)."""
    with nogil:
        (<kernel_t>kernel)(<void *>out, <void *>first, <void *>rows, nrows, row_stride, count, op, scale)
