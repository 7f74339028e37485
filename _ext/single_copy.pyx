# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Single-copy schedules: a rank reads its peers' buffers directly (cross-memory attach).

The copy path moves every byte twice: into the sender's slot of the shared
arena, then out into the receiver's buffer. Here a rank publishes the *address*
of its buffer on its control line with the step, and its peers read the bytes
straight from its address space with ``process_vm_readv`` (what Open MPI's
smsc/cma does): one copy. The owner may change its buffer again only once every
reader is done, which a last step says ("I finished reading your buffers").

Each schedule runs in C with the GIL released, like those of ``_schedules``:
posts, waits that return to Python when a slice expires (position p waits for
step base + p + 1; ``resume`` as there), the reads, and the reduction kernel
called by address. A read that fails (the peer exited: ESRCH; its buffer is
gone: EFAULT) returns FAILED with the errno and the peer in ``failed_errno`` /
``failed_peer``. ``posted`` and ``reached`` say, after DONE, the last step this
rank posted and the highest step it saw every rank reach (``Steps.record_schedule``).

Where the rank has several lanes (``shmcoll.lanes``), the reads and reductions between two meetings are
split over them (``set_lanes``; the lanes' pool runs the parts, ``pool_for``), while the meetings stay on the
caller's thread: each lane reads its stretch of every buffer, and reduces its stretch of the elements in
rank order through its own part of the scratch, so the bits are those of one thread. The split is this
rank's alone (no peer sees it), so it needs no agreement; a schedule takes its lane count from the
placement (``Lanes.for_bytes``).
"""
from libc.stdint cimport uint32_t, uint64_t, int64_t, uintptr_t, int32_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

from schedule cimport (kernel_t, task_t, pool_for_t, MAX_POOL_LANES, STATUS_DONE, STATUS_MISMATCH, STATUS_FAILED,
                       STATUS_SIZES)

include "lines.pxi"
include "size_tables.pxi"

cdef extern from "<errno.h>" nogil:
    int errno
    int EFAULT

cdef extern from "<sys/uio.h>" nogil:
    struct iovec:
        void *iov_base
        size_t iov_len
    ssize_t process_vm_readv(int pid, const iovec *local_iov, unsigned long liovcnt,
                             const iovec *remote_iov, unsigned long riovcnt, unsigned long flags)

cdef enum:
    _ON = -100  # _open's "go on"; never returned to Python

DONE = STATUS_DONE
MISMATCH = STATUS_MISMATCH
FAILED = STATUS_FAILED
SIZES = STATUS_SIZES  # all_to_all: the size tables disagree (every rank sees the same tables, so every rank says so)


cdef inline uint64_t *_address_slot(uintptr_t lines, int rank, uint32_t step) noexcept nogil:
    return <uint64_t *>(lines + <uintptr_t>rank * _LINE + _ADDRESS + 8 * (step & 3))


def read(int pid, uintptr_t remote, uintptr_t local, Py_ssize_t nbytes):
    """Read ``nbytes`` of process ``pid`` at ``remote`` into ``local``, the GIL released: 0, or the errno
    that refused it (the probe's reads, and a point-to-point message read whole)."""
    cdef int err
    with nogil:
        err = _read(pid, <char *>local, remote, nbytes)
    return err


cdef int _read(int pid, char *local, uintptr_t remote, Py_ssize_t nbytes) noexcept nogil:
    """All of ``nbytes`` at ``remote`` in ``pid`` into ``local`` (the kernel may move fewer per call)."""
    cdef iovec mine, theirs
    cdef ssize_t got
    while nbytes > 0:
        mine.iov_base = local
        mine.iov_len = nbytes
        theirs.iov_base = <void *>remote
        theirs.iov_len = nbytes
        got = process_vm_readv(pid, &mine, 1, &theirs, 1, 0)
        if got < 0:
            return errno
        if got == 0:
            return EFAULT  # no progress: the range is not there
        local += got
        remote += got
        nbytes -= got
    return 0


# A lane's rows of the scratch (one per rank) hold at least this much each: fewer lanes reduce where the
# scratch cannot give every lane that (many ranks, a small SHMCOLL_CHUNK_BYTES).
DEF LEAST_ROW_BYTES = 4096


# Byte moves laid end to end as [0, total): move i is ``bytes[i]`` from ``source[i]`` in process ``pid[i]``
# (0: this one, a memcpy) to ``into[i]``; a lane that fails notes its errno and the move's peer.
ctypedef struct moves_t:
    int count
    int *pid
    int *peer
    char **into
    uintptr_t *source
    Py_ssize_t *bytes
    Py_ssize_t total
    int err[MAX_POOL_LANES]
    int failed_peer[MAX_POOL_LANES]


cdef void _moves_part(void *ctx, Py_ssize_t lo, Py_ssize_t hi, int lane) noexcept nogil:
    """Bytes [lo, hi) of the moves (a ``task_t``)."""
    cdef moves_t *m = <moves_t *>ctx
    cdef Py_ssize_t start = 0, a, b
    cdef int i, err
    for i in range(m.count):
        a = lo if lo > start else start
        b = hi if hi < start + m.bytes[i] else start + m.bytes[i]
        if a < b:
            if m.pid[i] == 0:
                memcpy(m.into[i] + (a - start), <char *>(m.source[i] + (a - start)), b - a)
            else:
                err = _read(m.pid[i], m.into[i] + (a - start), m.source[i] + (a - start), b - a)
                if err:
                    m.err[lane] = err
                    m.failed_peer[lane] = m.peer[i]
                    return
        start += m.bytes[i]


# A block of elements ``offset`` bytes into every rank's published buffer (ours at ``buffer``, peer p's at
# ``source[p]`` in process ``pid[p]``), reduced in rank order into ``out``; each lane through its own
# ``lane_scratch`` bytes of ``scratch``.
ctypedef struct reduction_t:
    int me, size, itemsize
    int *pid
    uintptr_t *source
    uintptr_t buffer
    Py_ssize_t offset
    char *out
    kernel_t kernel
    int64_t op
    double scale
    char *scratch
    Py_ssize_t lane_scratch
    int err[MAX_POOL_LANES]
    int failed_peer[MAX_POOL_LANES]


cdef void _reduction_part(void *ctx, Py_ssize_t lo, Py_ssize_t hi, int lane) noexcept nogil:
    """Elements [lo, hi) of the reduction (a ``task_t``): piece by piece, each rank's piece into a row of the
    lane's scratch (ours copied), the rows reduced into ``out``."""
    cdef reduction_t *r = <reduction_t *>ctx
    cdef int peer, err, itemsize = r.itemsize
    cdef Py_ssize_t piece = r.lane_scratch // (r.size * itemsize)
    cdef Py_ssize_t start = lo, n, at
    cdef char *rows = r.scratch + lane * r.lane_scratch
    while start < hi:
        n = piece if hi - start > piece else hi - start
        at = r.offset + start * itemsize
        for peer in range(r.size):
            if peer == r.me:
                memcpy(rows + peer * piece * itemsize, <char *>(r.buffer + at), n * itemsize)
            else:
                err = _read(r.pid[peer], rows + peer * piece * itemsize, r.source[peer] + at, n * itemsize)
                if err:
                    r.err[lane] = err
                    r.failed_peer[lane] = peer
                    return
        r.kernel(r.out + start * itemsize, rows, rows + piece * itemsize, r.size - 1, piece, n, r.op, r.scale)
        start += n


cdef class SingleCopy:
    """One rank's constants for the single-copy schedules over its arena's control lines."""

    cdef uintptr_t lines, scratch
    cdef int me, size
    cdef Py_ssize_t scratch_bytes
    cdef int64_t spin_ns, yield_ns, slice_ns
    cdef int yield_company  # see _wait_ranks (waits.Budgets.company)
    cdef readonly uint32_t posted, reached
    cdef readonly int failed_errno, failed_peer
    cdef pool_for_t pool_for  # the lanes' fan-out (set_lanes), and their pool; NULL: one thread
    cdef void *pool
    cdef moves_t moves  # the schedule's moves and reduction in progress, each array one entry per rank
    cdef reduction_t reduction

    def __cinit__(self, uintptr_t lines, int me, int size, uintptr_t scratch, Py_ssize_t scratch_bytes,
                  int64_t spin_ns, int64_t yield_ns, int yield_company, int64_t slice_ns):
        self.lines = lines
        self.me = me
        self.size = size
        self.scratch = scratch  # private to this rank: the peers' pieces of a reduction land here
        self.scratch_bytes = scratch_bytes
        self.slice_ns = slice_ns
        self.set_waits(spin_ns, yield_ns, yield_company)
        self.reduction.me, self.reduction.size = me, size
        self.reduction.scratch = <char *>scratch
        self.moves.pid = <int *>calloc(size, sizeof(int))
        self.moves.peer = <int *>calloc(size, sizeof(int))
        self.moves.into = <char **>calloc(size, sizeof(char *))
        self.moves.source = <uintptr_t *>calloc(size, sizeof(uintptr_t))
        self.moves.bytes = <Py_ssize_t *>calloc(size, sizeof(Py_ssize_t))
        self.reduction.pid = <int *>calloc(size, sizeof(int))
        self.reduction.source = <uintptr_t *>calloc(size, sizeof(uintptr_t))
        if (self.moves.pid == NULL or self.moves.peer == NULL or self.moves.into == NULL
                or self.moves.source == NULL or self.moves.bytes == NULL or self.reduction.pid == NULL
                or self.reduction.source == NULL):
            raise MemoryError()

    def __dealloc__(self):
        free(self.moves.pid)
        free(self.moves.peer)
        free(self.moves.into)
        free(self.moves.source)
        free(self.moves.bytes)
        free(self.reduction.pid)
        free(self.reduction.source)

    def set_lanes(self, uintptr_t pool_for, uintptr_t pool):
        """Split the reads and reductions of a schedule called with several lanes over the lanes' pool
        (``_schedules.Pool.runner``; 0, 0: none, one thread). The pool must outlive its use here."""
        self.pool_for = <pool_for_t>pool_for
        self.pool = <void *>pool

    def set_waits(self, int64_t spin_ns, int64_t yield_ns, int yield_company):
        self.spin_ns = spin_ns
        self.yield_ns = yield_ns
        self.yield_company = yield_company

    # -- pieces ------------------------------------------------------------------------

    cdef inline void _post_step(self, uint32_t step, uint64_t desc) noexcept nogil:
        """Post ``step`` and record it as posted (what the schedule reports)."""
        _post(self.lines, self.me, step, desc)
        self.posted = step

    cdef inline void _publish(self, uint32_t step, uint64_t desc, uintptr_t address) noexcept nogil:
        """Post ``step`` with our buffer's address (readable by the peers once they see the step)."""
        arch.shmcoll_store_release_u64(_address_slot(self.lines, self.me, step), address)
        self._post_step(step, desc)

    cdef inline int _wait_all(self, uint32_t step) noexcept nogil:
        """1 once every rank has reached ``step``; 0 if the slice ended first."""
        if _wait_ranks(self.lines, 0, self.size, self.me, step, self.spin_ns, self.yield_ns, self.slice_ns,
                       self.yield_company) >= 0:
            return 0
        self.reached = step
        return 1

    cdef inline Py_ssize_t _open(self, uint32_t base, uint64_t desc, uintptr_t address,
                                 Py_ssize_t resume) noexcept nogil:
        """Every schedule's first step: post base + 1 with ``address``, wait for every rank, check they all
        are in this collective. _ON to go on, else the status to return (0: the wait's slice ended)."""
        if resume < 0:
            self._publish(base + 1, desc, address)
            if not self._wait_all(base + 1):
                return 0
        if resume < 1 and _first_mismatch(self.lines, 0, self.size, base + 1, desc) >= 0:
            return STATUS_MISMATCH
        return _ON

    cdef inline uintptr_t _their(self, int peer, uint32_t step) noexcept nogil:
        return <uintptr_t>arch.shmcoll_load_acquire_u64(_address_slot(self.lines, peer, step))

    cdef inline int _pid(self, int peer) noexcept nogil:
        return (<int32_t *>(self.lines + <uintptr_t>peer * _LINE + _PID))[0]

    cdef inline Py_ssize_t _fail(self, int peer, int err) noexcept nogil:
        self.failed_peer = peer
        self.failed_errno = err
        return STATUS_FAILED

    cdef void _split(self, int lanes, task_t task, void *ctx, int *errs, Py_ssize_t count,
                     Py_ssize_t align) noexcept nogil:
        """``task`` over [0, ``count``) on ``lanes`` lanes (one thread where there is no pool), ``errs`` of
        every lane cleared first."""
        cdef int j
        for j in range(MAX_POOL_LANES):
            errs[j] = 0
        if lanes > 1 and self.pool_for != NULL:
            self.pool_for(self.pool, lanes, task, ctx, count, align)
        else:
            task(ctx, 0, count, 0)

    cdef Py_ssize_t _first_failure(self, int *errs, int *peers) noexcept nogil:
        """FAILED with the first failing lane's errno and peer, else _ON."""
        cdef int j
        for j in range(MAX_POOL_LANES):
            if errs[j]:
                return self._fail(peers[j], errs[j])
        return _ON

    cdef void _move(self, int peer, char *into, uintptr_t source, Py_ssize_t nbytes) noexcept nogil:
        """One more move for ``_moves``: ``nbytes`` at ``source`` in ``peer`` (ourselves: a memcpy) to ``into``."""
        cdef moves_t *m = &self.moves
        cdef int i = m.count
        m.pid[i] = 0 if peer == self.me else self._pid(peer)
        m.peer[i] = peer
        m.into[i] = into
        m.source[i] = source
        m.bytes[i] = nbytes
        m.count = i + 1
        m.total += nbytes

    cdef Py_ssize_t _moves(self, int lanes) noexcept nogil:
        """The moves added since the last call, over ``lanes`` lanes: _ON, or FAILED."""
        cdef moves_t *m = &self.moves
        self._split(lanes, _moves_part, m, m.err, m.total, 64)
        m.count = 0
        m.total = 0
        return self._first_failure(m.err, m.failed_peer)

    cdef Py_ssize_t _reduce_over_lanes(self, int lanes, uint32_t step, uintptr_t buffer, Py_ssize_t offset,
                                       Py_ssize_t count, int itemsize, char *out, kernel_t kernel, int64_t op,
                                       double scale) noexcept nogil:
        """``count`` elements ``offset`` bytes into every rank's buffer published with ``step`` (ours at
        ``buffer``), reduced in rank order into ``out``, over ``lanes`` lanes (fewer where the scratch cannot
        give each its rows): _ON, or FAILED."""
        cdef reduction_t *r = &self.reduction
        cdef int peer
        lanes = <int>max(1, min(<Py_ssize_t>lanes, self.scratch_bytes // (self.size * LEAST_ROW_BYTES)))
        r.itemsize = itemsize
        for peer in range(self.size):
            if peer != self.me:
                r.pid[peer] = self._pid(peer)
                r.source[peer] = self._their(peer, step)
        r.buffer, r.offset, r.out = buffer, offset, out
        r.kernel, r.op, r.scale = kernel, op, scale
        r.lane_scratch = self.scratch_bytes if lanes == 1 else self.scratch_bytes // lanes // 64 * 64
        self._split(lanes, _reduction_part, r, r.err, count, max(1, 64 // itemsize))
        return self._first_failure(r.err, r.failed_peer)

    # -- schedules ---------------------------------------------------------------------

    def allgather(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, uintptr_t out,
                  Py_ssize_t out_stride, int lanes, Py_ssize_t resume):
        """Every rank's ``nbytes`` at ``addr`` to ``out + rank * out_stride`` on every rank, the reads over
        ``lanes`` lanes.

        base + 1: our input's address; everyone reads everyone's; base + 2: done reading.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._allgather(base, desc, addr, nbytes, <char *>out, out_stride, lanes, resume)
        return status

    cdef Py_ssize_t _allgather(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, char *out,
                               Py_ssize_t out_stride, int lanes, Py_ssize_t resume) noexcept nogil:
        cdef int peer, me = self.me
        cdef Py_ssize_t status
        cdef bint own = out + me * out_stride != <char *>addr  # our block still to copy
        if resume < 0:
            self._publish(base + 1, desc, addr)
            if own and lanes <= 1:  # on one thread while the peers arrive; over lanes, with the reads
                memcpy(out + me * out_stride, <char *>addr, nbytes)
            if not self._wait_all(base + 1):
                return 0
        if resume < 1:
            if _first_mismatch(self.lines, 0, self.size, base + 1, desc) >= 0:
                return STATUS_MISMATCH
            for peer in range(self.size):
                if peer != me:
                    self._move(peer, out + peer * out_stride, self._their(peer, base + 1), nbytes)
                elif own and lanes > 1:
                    self._move(me, out + me * out_stride, addr, nbytes)
            status = self._moves(lanes)
            if status != _ON:
                return status
            self._post_step(base + 2, desc)
            if not self._wait_all(base + 2):
                return 1
        return STATUS_DONE

    def broadcast(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, int root, int lanes,
                  Py_ssize_t resume):
        """``nbytes`` at ``addr`` on ``root`` to ``addr`` on every rank, the read over ``lanes`` lanes.

        base + 1: the root's address (the others post it empty); every rank checks the others are in
        this broadcast; the others read the root's buffer and post base + 2, which the root waits for.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._broadcast(base, desc, addr, nbytes, root, lanes, resume)
        return status

    cdef Py_ssize_t _broadcast(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, int root,
                               int lanes, Py_ssize_t resume) noexcept nogil:
        cdef int me = self.me
        cdef Py_ssize_t status = self._open(base, desc, addr if me == root else 0, resume)
        if status != _ON:
            return status
        if resume < 1:
            if me != root:
                self._move(root, <char *>addr, self._their(root, base + 1), nbytes)
                status = self._moves(lanes)
                if status != _ON:
                    return status
            self._post_step(base + 2, desc)
            if me == root and not self._wait_all(base + 2):
                return 1
        return STATUS_DONE

    def gather(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, int root, uintptr_t outs,
               int lanes, Py_ssize_t resume):
        """Every rank's ``nbytes`` at ``addr`` to ``outs[rank]`` on ``root`` (``outs``: an array of one
        address per rank, read on the root only); ``root`` -1: on every rank (an all_gather into separate
        outputs, none of which may overlap the input but the own one exactly).

        base + 1: our input's address; every rank checks the others are in this gather; the root reads
        every input (over ``lanes`` lanes); base + 2: the root is done reading, which every rank waits for.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._gather(base, desc, addr, nbytes, root, <uint64_t *>outs, lanes, resume)
        return status

    cdef Py_ssize_t _gather(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, int root,
                            uint64_t *outs, int lanes, Py_ssize_t resume) noexcept nogil:
        cdef int peer, me = self.me
        cdef Py_ssize_t status = self._open(base, desc, addr, resume)
        if status != _ON:
            return status
        if resume < 1:
            if me == root or root < 0:
                if outs[me] != addr:  # first: a lone root's output may overlap its input, which nobody reads
                    memcpy(<char *>outs[me], <char *>addr, nbytes)
                for peer in range(self.size):
                    if peer != me:
                        self._move(peer, <char *>outs[peer], self._their(peer, base + 1), nbytes)
                status = self._moves(lanes)
                if status != _ON:
                    return status
            self._post_step(base + 2, desc)
            if not self._wait_all(base + 2):
                return 1
        return STATUS_DONE

    def scatter(self, uint32_t base, uint64_t desc, uintptr_t ins, Py_ssize_t nbytes, int root, uintptr_t out,
                int lanes, Py_ssize_t resume):
        """``nbytes`` at ``ins[rank]`` on ``root`` to ``out`` on every rank (``ins``: an array of one
        address per rank, on the root).

        base + 1: the root's array of addresses (the others post it empty); every rank checks the others
        are in this scatter; the others read their entry of the root's array, then their block (over
        ``lanes`` lanes), and post base + 2, which the root waits for before it copies its own block.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._scatter(base, desc, ins, nbytes, root, <char *>out, lanes, resume)
        return status

    cdef Py_ssize_t _scatter(self, uint32_t base, uint64_t desc, uintptr_t ins, Py_ssize_t nbytes, int root,
                             char *out, int lanes, Py_ssize_t resume) noexcept nogil:
        cdef int err, me = self.me
        cdef uint64_t theirs
        cdef Py_ssize_t status = self._open(base, desc, ins if me == root else 0, resume)
        if status != _ON:
            return status
        if resume < 1:
            if me != root:
                err = _read(self._pid(root), <char *>&theirs, self._their(root, base + 1) + 8 * me, 8)
                if err:
                    return self._fail(root, err)
                self._move(root, out, theirs, nbytes)
                status = self._moves(lanes)
                if status != _ON:
                    return status
            self._post_step(base + 2, desc)
            if me == root and not self._wait_all(base + 2):
                return 1
        # The root's own block last: its output may overlap an input a peer was reading.
        if me == root and <uintptr_t>out != (<uint64_t *>ins)[me]:
            memcpy(out, <char *>(<uint64_t *>ins)[me], nbytes)
        return STATUS_DONE

    def alltoall(self, uint32_t base, uint64_t desc, uintptr_t sends, uintptr_t recvs, uintptr_t tables,
                 Py_ssize_t table_stride, int lanes, Py_ssize_t resume):
        """Rank r's block for rank j to rank j. ``sends``/``recvs``: arrays of (address, bytes) per rank
        (recvs[j]: where what rank j sends us goes). ``tables``: the arena's size tables of step base + 1,
        each rank's row ``table_stride`` bytes apart (its send sizes, then its receive sizes), which every
        rank wrote before the schedule.

        base + 1: our ``sends`` array's address; every rank checks the others are in this all_to_all and
        that every block has the size its receiver expects (SIZES, else), then reads its entry of each
        peer's array and then the blocks (over ``lanes`` lanes, its own block's copy among them); base + 2:
        done reading.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._alltoall(base, desc, sends, <uint64_t *>recvs, tables, table_stride, lanes, resume)
        return status

    cdef Py_ssize_t _alltoall(self, uint32_t base, uint64_t desc, uintptr_t sends, uint64_t *recvs,
                              uintptr_t tables, Py_ssize_t table_stride, int lanes,
                              Py_ssize_t resume) noexcept nogil:
        cdef int peer, other, err, me = self.me, size = self.size
        cdef uint64_t entry[2]
        cdef Py_ssize_t status = self._open(base, desc, sends, resume)
        if status != _ON:
            return status
        if resume < 1:
            if size_disagreement(size, <const char *>tables, table_stride) >= 0:
                return STATUS_SIZES
            for peer in range(size):
                if peer == me:
                    if recvs[2 * me] != (<uint64_t *>sends)[2 * me]:
                        self._move(me, <char *>recvs[2 * me], (<uint64_t *>sends)[2 * me], recvs[2 * me + 1])
                elif recvs[2 * peer + 1] > 0:
                    err = _read(self._pid(peer), <char *>entry, self._their(peer, base + 1) + 16 * me, 16)
                    if err:
                        self.moves.count = self.moves.total = 0  # none of them made
                        return self._fail(peer, err)
                    self._move(peer, <char *>recvs[2 * peer], entry[0], recvs[2 * peer + 1])
            status = self._moves(lanes)
            if status != _ON:
                return status
            self._post_step(base + 2, desc)
            if not self._wait_all(base + 2):
                return 1
        return STATUS_DONE

    def reduce_scatter(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t block_count,
                       Py_ssize_t block_stride, int itemsize, uintptr_t out, uintptr_t kernel, int64_t op,
                       double scale, int lanes, Py_ssize_t resume):
        """Block r of every rank's input (L blocks of ``block_count`` elements, ``block_stride`` apart, at
        ``addr``), reduced in rank order, into rank r's ``out`` (which must not overlap the input, but may be
        exactly block r: only rank r reads it, and each piece is copied to scratch before its result lands).

        base + 1: our input's address; piece by piece, each peer's part of our block is read into a
        row of our scratch and the rows reduced into ``out`` (over ``lanes`` lanes); base + 2: done reading.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._reduce_blocks(base, desc, addr, self.me * block_stride * itemsize, block_count, itemsize,
                                         <char *>out, <kernel_t>kernel, op, scale, lanes, resume)
        return status

    def allreduce(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t count, int itemsize,
                  uintptr_t kernel, int64_t op, double scale, int lanes, Py_ssize_t resume):
        """All-reduce ``count`` elements at ``addr`` in place: rank r reduces the r-th share of everyone's
        buffer into its own (as ``reduce_scatter``), posts base + 2 (done reading, our share final), then
        reads every other share from its owner's buffer; base + 3: done reading. Both over ``lanes`` lanes."""
        cdef Py_ssize_t status
        with nogil:
            status = self._allreduce(base, desc, addr, count, itemsize, <kernel_t>kernel, op, scale, lanes, resume)
        return status

    cdef Py_ssize_t _allreduce(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t count, int itemsize,
                               kernel_t kernel, int64_t op, double scale, int lanes,
                               Py_ssize_t resume) noexcept nogil:
        cdef int peer, me = self.me, size = self.size
        cdef Py_ssize_t lo, hi, status
        if resume < 2:
            # Shares: rank r owns elements [r * count / L, (r + 1) * count / L), in place.
            lo = me * count // size
            status = self._reduce_blocks(base, desc, addr, lo * itemsize, (me + 1) * count // size - lo, itemsize,
                                         <char *>(addr + lo * itemsize), kernel, op, scale, lanes, resume)
            if status != STATUS_DONE:
                return status
        if resume < 3:
            for peer in range(size):
                if peer != me:
                    lo = peer * count // size
                    hi = (peer + 1) * count // size
                    self._move(peer, <char *>(addr + lo * itemsize), self._their(peer, base + 1) + lo * itemsize,
                               (hi - lo) * itemsize)
            status = self._moves(lanes)
            if status != _ON:
                return status
            self._post_step(base + 3, desc)
            if not self._wait_all(base + 3):
                return 2
        return STATUS_DONE

    def reduce(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t count, int itemsize, int root,
               uintptr_t kernel, int64_t op, double scale, int lanes, Py_ssize_t resume):
        """Reduce every rank's ``count`` elements at ``addr`` into the root's, in place, in rank order.

        base + 1: our input's address; the root reads every input piece by piece (``_reduce_blocks``
        over the whole buffer) while the others wait; base + 2: the root is done reading.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._reduce(base, desc, addr, count, itemsize, root, <kernel_t>kernel, op, scale, lanes,
                                  resume)
        return status

    cdef Py_ssize_t _reduce(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t count, int itemsize,
                            int root, kernel_t kernel, int64_t op, double scale, int lanes,
                            Py_ssize_t resume) noexcept nogil:
        if self.me == root:
            # In place is safe: each piece of ours is copied to scratch before its result is written, and
            # nobody reads the root's buffer.
            return self._reduce_blocks(base, desc, addr, 0, count, itemsize, <char *>addr, kernel, op, scale,
                                       lanes, resume)
        cdef Py_ssize_t status = self._open(base, desc, addr, resume)
        if status != _ON:
            return status
        if resume < 1:
            self._post_step(base + 2, desc)
            if not self._wait_all(base + 2):
                return 1
        return STATUS_DONE

    cdef Py_ssize_t _reduce_blocks(self, uint32_t base, uint64_t desc, uintptr_t buffer, Py_ssize_t offset,
                                   Py_ssize_t count, int itemsize, char *out, kernel_t kernel, int64_t op,
                                   double scale, int lanes, Py_ssize_t resume) noexcept nogil:
        """Steps base + 1 and base + 2 of a reduce-scatter. Every rank's buffer has one layout: ours is at
        ``buffer`` (published with base + 1), our block's ``count`` elements ``offset`` bytes into it, and so
        into every peer's. Each piece of the block is read from every peer into a row of our scratch (ours
        copied there), and the rows reduced in rank order into ``out`` (``_reduce_over_lanes``)."""
        cdef Py_ssize_t status = self._open(base, desc, buffer, resume)
        if status != _ON:
            return status
        if resume < 1:
            status = self._reduce_over_lanes(lanes, base + 1, buffer, offset, count, itemsize, out, kernel, op,
                                             scale)
            if status != _ON:
                return status
            self._post_step(base + 2, desc)
            if not self._wait_all(base + 2):
                return 1
        return STATUS_DONE
