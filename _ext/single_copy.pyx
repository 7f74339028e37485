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
"""
from libc.stdint cimport uint32_t, uint64_t, int64_t, uintptr_t, int32_t
from libc.string cimport memcpy

from schedule cimport kernel_t, STATUS_DONE, STATUS_MISMATCH, STATUS_FAILED, STATUS_SIZES

include "lines.pxi"

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


cdef class SingleCopy:
    """One rank's constants for the single-copy schedules over its arena's control lines."""

    cdef uintptr_t lines, scratch
    cdef int me, size
    cdef Py_ssize_t scratch_bytes
    cdef int64_t spin_ns, yield_ns, slice_ns
    cdef int yield_company  # see _wait_ranks (waits.Budgets.company)
    cdef readonly uint32_t posted, reached
    cdef readonly int failed_errno, failed_peer

    def __cinit__(self, uintptr_t lines, int me, int size, uintptr_t scratch, Py_ssize_t scratch_bytes,
                  int64_t spin_ns, int64_t yield_ns, int yield_company, int64_t slice_ns):
        self.lines = lines
        self.me = me
        self.size = size
        self.scratch = scratch  # private to this rank: the peers' pieces of a reduction land here
        self.scratch_bytes = scratch_bytes
        self.slice_ns = slice_ns
        self.set_waits(spin_ns, yield_ns, yield_company)

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

    # -- schedules ---------------------------------------------------------------------

    def allgather(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, uintptr_t out,
                  Py_ssize_t out_stride, Py_ssize_t resume):
        """Every rank's ``nbytes`` at ``addr`` to ``out + rank * out_stride`` on every rank.

        base + 1: our input's address; everyone reads everyone's; base + 2: done reading.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._allgather(base, desc, addr, nbytes, <char *>out, out_stride, resume)
        return status

    cdef Py_ssize_t _allgather(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, char *out,
                               Py_ssize_t out_stride, Py_ssize_t resume) noexcept nogil:
        cdef int peer, err, me = self.me
        if resume < 0:
            self._publish(base + 1, desc, addr)
            if out + me * out_stride != <char *>addr:
                memcpy(out + me * out_stride, <char *>addr, nbytes)
            if not self._wait_all(base + 1):
                return 0
        if resume < 1:
            if _first_mismatch(self.lines, 0, self.size, base + 1, desc) >= 0:
                return STATUS_MISMATCH
            for peer in range(self.size):
                if peer != me:
                    err = _read(self._pid(peer), out + peer * out_stride, self._their(peer, base + 1), nbytes)
                    if err:
                        return self._fail(peer, err)
            self._post_step(base + 2, desc)
            if not self._wait_all(base + 2):
                return 1
        return STATUS_DONE

    def broadcast(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, int root,
                  Py_ssize_t resume):
        """``nbytes`` at ``addr`` on ``root`` to ``addr`` on every rank.

        base + 1: the root's address (the others post it empty); every rank checks the others are in
        this broadcast; the others read the root's buffer and post base + 2, which the root waits for.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._broadcast(base, desc, addr, nbytes, root, resume)
        return status

    cdef Py_ssize_t _broadcast(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, int root,
                               Py_ssize_t resume) noexcept nogil:
        cdef int err, me = self.me
        cdef Py_ssize_t status = self._open(base, desc, addr if me == root else 0, resume)
        if status != _ON:
            return status
        if resume < 1:
            if me != root:
                err = _read(self._pid(root), <char *>addr, self._their(root, base + 1), nbytes)
                if err:
                    return self._fail(root, err)
            self._post_step(base + 2, desc)
            if me == root and not self._wait_all(base + 2):
                return 1
        return STATUS_DONE

    def gather(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, int root, uintptr_t outs,
               Py_ssize_t resume):
        """Every rank's ``nbytes`` at ``addr`` to ``outs[rank]`` on ``root`` (``outs``: an array of one
        address per rank, read on the root only); ``root`` -1: on every rank (an all_gather into separate
        outputs, none of which may overlap the input but the own one exactly).

        base + 1: our input's address; every rank checks the others are in this gather; the root reads
        every input; base + 2: the root is done reading, which every rank waits for.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._gather(base, desc, addr, nbytes, root, <uint64_t *>outs, resume)
        return status

    cdef Py_ssize_t _gather(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, int root,
                            uint64_t *outs, Py_ssize_t resume) noexcept nogil:
        cdef int peer, err, me = self.me
        cdef Py_ssize_t status = self._open(base, desc, addr, resume)
        if status != _ON:
            return status
        if resume < 1:
            if me == root or root < 0:
                if outs[me] != addr:  # first: a lone root's output may overlap its input, which nobody reads
                    memcpy(<char *>outs[me], <char *>addr, nbytes)
                for peer in range(self.size):
                    if peer != me:
                        err = _read(self._pid(peer), <char *>outs[peer], self._their(peer, base + 1), nbytes)
                        if err:
                            return self._fail(peer, err)
            self._post_step(base + 2, desc)
            if not self._wait_all(base + 2):
                return 1
        return STATUS_DONE

    def scatter(self, uint32_t base, uint64_t desc, uintptr_t ins, Py_ssize_t nbytes, int root, uintptr_t out,
                Py_ssize_t resume):
        """``nbytes`` at ``ins[rank]`` on ``root`` to ``out`` on every rank (``ins``: an array of one
        address per rank, on the root).

        base + 1: the root's array of addresses (the others post it empty); every rank checks the others
        are in this scatter; the others read their entry of the root's array, then their block, and post
        base + 2, which the root waits for before it copies its own block.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._scatter(base, desc, ins, nbytes, root, <char *>out, resume)
        return status

    cdef Py_ssize_t _scatter(self, uint32_t base, uint64_t desc, uintptr_t ins, Py_ssize_t nbytes, int root,
                             char *out, Py_ssize_t resume) noexcept nogil:
        cdef int err, me = self.me
        cdef uint64_t theirs
        cdef Py_ssize_t status = self._open(base, desc, ins if me == root else 0, resume)
        if status != _ON:
            return status
        if resume < 1:
            if me != root:
                err = _read(self._pid(root), <char *>&theirs, self._their(root, base + 1) + 8 * me, 8)
                if not err:
                    err = _read(self._pid(root), out, theirs, nbytes)
                if err:
                    return self._fail(root, err)
            self._post_step(base + 2, desc)
            if me == root and not self._wait_all(base + 2):
                return 1
        # The root's own block last: its output may overlap an input a peer was reading.
        if me == root and <uintptr_t>out != (<uint64_t *>ins)[me]:
            memcpy(out, <char *>(<uint64_t *>ins)[me], nbytes)
        return STATUS_DONE

    def alltoall(self, uint32_t base, uint64_t desc, uintptr_t sends, uintptr_t recvs, uintptr_t tables,
                 Py_ssize_t table_stride, Py_ssize_t resume):
        """Rank r's block for rank j to rank j. ``sends``/``recvs``: arrays of (address, bytes) per rank
        (recvs[j]: where what rank j sends us goes). ``tables``: the arena's size tables of step base + 1,
        each rank's row ``table_stride`` bytes apart (its send sizes, then its receive sizes), which every
        rank wrote before the schedule.

        base + 1: our ``sends`` array's address; every rank checks the others are in this all_to_all and
        that every block has the size its receiver expects (SIZES, else), then reads its entry of each
        peer's array and that peer's block; base + 2: done reading.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._alltoall(base, desc, sends, <uint64_t *>recvs, tables, table_stride, resume)
        return status

    cdef Py_ssize_t _alltoall(self, uint32_t base, uint64_t desc, uintptr_t sends, uint64_t *recvs,
                              uintptr_t tables, Py_ssize_t table_stride, Py_ssize_t resume) noexcept nogil:
        cdef int peer, other, err, me = self.me, size = self.size
        cdef uint64_t entry[2]
        cdef Py_ssize_t status = self._open(base, desc, sends, resume)
        if status != _ON:
            return status
        if resume < 1:
            for peer in range(size):  # what peer sends other, against what other expects from peer
                for other in range(size):
                    if ((<int64_t *>(tables + peer * table_stride))[other]
                            != (<int64_t *>(tables + other * table_stride))[size + peer]):
                        return STATUS_SIZES
            for peer in range(size):
                if peer == me:
                    if recvs[2 * me] != (<uint64_t *>sends)[2 * me]:
                        memcpy(<char *>recvs[2 * me], <char *>(<uint64_t *>sends)[2 * me], recvs[2 * me + 1])
                elif recvs[2 * peer + 1] > 0:
                    err = _read(self._pid(peer), <char *>entry, self._their(peer, base + 1) + 16 * me, 16)
                    if not err:
                        err = _read(self._pid(peer), <char *>recvs[2 * peer], entry[0], recvs[2 * peer + 1])
                    if err:
                        return self._fail(peer, err)
            self._post_step(base + 2, desc)
            if not self._wait_all(base + 2):
                return 1
        return STATUS_DONE

    def reduce_scatter(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t block_count,
                       Py_ssize_t block_stride, int itemsize, uintptr_t out, uintptr_t kernel, int64_t op,
                       double scale, Py_ssize_t resume):
        """Block r of every rank's input (L blocks of ``block_count`` elements, ``block_stride`` apart, at
        ``addr``), reduced in rank order, into rank r's ``out`` (which must not overlap the input, but may be
        exactly block r: only rank r reads it, and each piece is copied to scratch before its result lands).

        base + 1: our input's address; piece by piece, each peer's part of our block is read into a
        row of our scratch and the rows reduced into ``out``; base + 2: done reading.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._reduce_blocks(base, desc, addr, self.me * block_stride * itemsize, block_count, itemsize,
                                         <char *>out, <kernel_t>kernel, op, scale, resume)
        return status

    def allreduce(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t count, int itemsize,
                  uintptr_t kernel, int64_t op, double scale, Py_ssize_t resume):
        """All-reduce ``count`` elements at ``addr`` in place: rank r reduces the r-th share of everyone's
        buffer into its own (as ``reduce_scatter``), posts base + 2 (done reading, our share final), then
        reads every other share from its owner's buffer; base + 3: done reading."""
        cdef Py_ssize_t status
        with nogil:
            status = self._allreduce(base, desc, addr, count, itemsize, <kernel_t>kernel, op, scale, resume)
        return status

    cdef Py_ssize_t _allreduce(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t count, int itemsize,
                               kernel_t kernel, int64_t op, double scale, Py_ssize_t resume) noexcept nogil:
        cdef int peer, err, me = self.me, size = self.size
        cdef Py_ssize_t lo, hi, status
        if resume < 2:
            # Shares: rank r owns elements [r * count / L, (r + 1) * count / L), in place.
            lo = me * count // size
            status = self._reduce_blocks(base, desc, addr, lo * itemsize, (me + 1) * count // size - lo, itemsize,
                                         <char *>(addr + lo * itemsize), kernel, op, scale, resume)
            if status != STATUS_DONE:
                return status
        if resume < 3:
            for peer in range(size):
                if peer != me:
                    lo = peer * count // size
                    hi = (peer + 1) * count // size
                    err = _read(self._pid(peer), <char *>(addr + lo * itemsize),
                                self._their(peer, base + 1) + lo * itemsize, (hi - lo) * itemsize)
                    if err:
                        return self._fail(peer, err)
            self._post_step(base + 3, desc)
            if not self._wait_all(base + 3):
                return 2
        return STATUS_DONE

    def reduce(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t count, int itemsize, int root,
               uintptr_t kernel, int64_t op, double scale, Py_ssize_t resume):
        """Reduce every rank's ``count`` elements at ``addr`` into the root's, in place, in rank order.

        base + 1: our input's address; the root reads every input piece by piece (``_reduce_blocks``
        over the whole buffer) while the others wait; base + 2: the root is done reading.
        """
        cdef Py_ssize_t status
        with nogil:
            status = self._reduce(base, desc, addr, count, itemsize, root, <kernel_t>kernel, op, scale, resume)
        return status

    cdef Py_ssize_t _reduce(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t count, int itemsize,
                            int root, kernel_t kernel, int64_t op, double scale, Py_ssize_t resume) noexcept nogil:
        if self.me == root:
            # In place is safe: each piece of ours is copied to scratch before its result is written, and
            # nobody reads the root's buffer.
            return self._reduce_blocks(base, desc, addr, 0, count, itemsize, <char *>addr, kernel, op, scale,
                                       resume)
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
                                   double scale, Py_ssize_t resume) noexcept nogil:
        """Steps base + 1 and base + 2 of a reduce-scatter. Every rank's buffer has one layout: ours is at
        ``buffer`` (published with base + 1), our block's ``count`` elements ``offset`` bytes into it, and so
        into every peer's. Each piece of the block is read from every peer into a row of our scratch (ours
        copied there), and the rows reduced in rank order into ``out``."""
        cdef int peer, err, me = self.me, size = self.size
        cdef Py_ssize_t piece = self.scratch_bytes // (size * itemsize)
        cdef Py_ssize_t start = 0, n
        cdef char *rows = <char *>self.scratch
        cdef Py_ssize_t status = self._open(base, desc, buffer, resume)
        if status != _ON:
            return status
        if resume < 1:
            while start < count:
                n = piece if count - start > piece else count - start
                for peer in range(size):
                    if peer == me:
                        memcpy(rows + peer * piece * itemsize, <char *>(buffer + offset + start * itemsize),
                               n * itemsize)
                    else:
                        err = _read(self._pid(peer), rows + peer * piece * itemsize,
                                    self._their(peer, base + 1) + offset + start * itemsize, n * itemsize)
                        if err:
                            return self._fail(peer, err)
                kernel(out + start * itemsize, rows, rows + piece * itemsize, size - 1, piece, n, op, scale)
                start += n
            self._post_step(base + 2, desc)
            if not self._wait_all(base + 2):
                return 1
        return STATUS_DONE
