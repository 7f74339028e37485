# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Point-to-point messages' bytes through the arena's channels, moved in C with the GIL released.

``shmcoll.p2p`` keeps what a transfer is (its order among the others, its Work, the thread that progresses
it); this moves its chunks. A Python pass per chunk cost more than the chunk's copy: small messages took
14-17 us each way and large ones streamed at 3.3 GB/s on the 2-core VM (BENCHMARKS.md, "Point-to-point").

A channel per ordered pair of local ranks (arena.py's layout): two control lines, the sender's count of the
chunks it posted (line 0) and the receiver's count of the chunks it took (line 1), and two halves of
``half_bytes``. Chunk c goes through half c % 2, which the sender may write once the receiver has taken chunk
c - 2; each half starts with a header of five int64 (tag, message bytes, offset, chunk bytes, the sender's
address) in ``HEADER_BYTES``. A message of n bytes is max(1, ceil(n / payload)) chunks, each full but the
last, so a transfer's progress is a count of its chunks. A chunk of DIRECT bytes carries no data but the
address of the sender's whole message, which the receiver reads itself (``shmcoll.single_copy``).

``send`` and ``recv`` move as many chunks as the channel allows, then wait for it up to ``slice_ns`` (0: not
at all) with the given budgets (spin, sched_yield, futex, and ``yield_company``; lines.pxi), so a caller that
waits for one transfer
makes one call per slice instead of one pass per chunk.
"""
from libc.stdint cimport uint32_t, uint64_t, int64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy
from shmcoll._state cimport GroupState, Backlog

include "lines.pxi"

cdef enum:
    _HEADER = 64
    _DIRECT = -1
    _MISMATCH = -2
    _DIRECT_CHUNK = -3

HEADER_BYTES = _HEADER
DIRECT = _DIRECT  # a header's chunk bytes when the chunk carries the sender's address
# What ``recv`` returns instead of a count of chunks:
MISMATCH = _MISMATCH  # the next chunk is not the one expected (``next_header`` says what it is)
DIRECT_CHUNK = _DIRECT_CHUNK  # the next chunk gives the sender's address: the caller reads the message


cdef inline Py_ssize_t _chunks(Py_ssize_t nbytes, Py_ssize_t payload) noexcept nogil:
    return 1 if nbytes <= payload else (nbytes + payload - 1) // payload


cdef class Channels:
    """This rank's ends of its node's channels, and the count of chunks it posted to and took from each peer."""

    cdef uintptr_t lines, data, rank_lines
    cdef Py_ssize_t p2p_bytes
    cdef readonly Py_ssize_t half_bytes, payload
    cdef readonly int me, size
    cdef uint32_t *posted  # per peer: chunks posted on the channel to it
    cdef uint32_t *taken  # per peer: chunks taken from the channel from it

    def __cinit__(self, uintptr_t lines, uintptr_t data, Py_ssize_t p2p_bytes, int me, int size,
                  uintptr_t rank_lines):
        self.lines, self.data, self.p2p_bytes, self.me, self.size = lines, data, p2p_bytes, me, size
        self.rank_lines = rank_lines  # the ranks' own control lines, where a wait records its CPU
        self.half_bytes = p2p_bytes // 2
        self.payload = self.half_bytes - _HEADER
        self.posted = <uint32_t *>calloc(size, sizeof(uint32_t))
        self.taken = <uint32_t *>calloc(size, sizeof(uint32_t))
        if self.posted == NULL or self.taken == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.posted)
        free(self.taken)

    cdef inline uintptr_t _lines(self, int source, int destination) noexcept nogil:
        return self.lines + <uintptr_t>(source * self.size + destination) * 2 * _LINE

    cdef inline int64_t *_half(self, int source, int destination, uint32_t chunk) noexcept nogil:
        return <int64_t *>(self.data + <uintptr_t>(source * self.size + destination) * self.p2p_bytes
                           + (chunk & 1) * self.half_bytes)

    cdef inline bint _wait(self, uintptr_t lines, int line, uint32_t target, int64_t end, int64_t spin_ns,
                           int64_t yield_ns, int yield_company) noexcept nogil:
        """Whether ``line`` reached ``target`` before ``end`` (ns; 0: do not wait). ``yield_company`` as for
        the collectives' waits (lines.pxi, ``_wait_ranks``), through the ranks' own lines."""
        cdef int64_t now
        if arch.shmcoll_reached(arch.shmcoll_load_acquire_u32(_step_word(lines, line)), target):
            return True
        if end == 0:
            return False
        if yield_company > 0 and yield_ns > 0 and not _record_cpu_find_company(self.rank_lines, yield_company,
                                                                                  self.me):
            yield_ns = 0
        now = arch.shmcoll_now_ns()
        return now < end and _wait_ranks(lines, line, line + 1, -1, target, spin_ns, yield_ns, end - now, 0) < 0

    def chunks(self, Py_ssize_t nbytes) -> int:
        """How many chunks a message of ``nbytes`` is."""
        return _chunks(nbytes, self.payload)

    # -- the sender ------------------------------------------------------------

    def send(self, int peer, uintptr_t addr, Py_ssize_t nbytes, int64_t tag, Py_ssize_t done, int64_t slice_ns,
             int64_t spin_ns, int64_t yield_ns, int yield_company=0) -> int:
        """Post the chunks of a message of ``nbytes`` at ``addr`` to ``peer`` from its chunk ``done`` on, as far
        as the channel's halves are free, waiting for them up to ``slice_ns``: the message's chunks posted."""
        with nogil:
            done = self._send(peer, <char *>addr, nbytes, tag, done, slice_ns, spin_ns, yield_ns, yield_company)
        return done

    cdef Py_ssize_t _send(self, int peer, char *addr, Py_ssize_t nbytes, int64_t tag, Py_ssize_t done,
                          int64_t slice_ns, int64_t spin_ns, int64_t yield_ns, int yield_company) noexcept nogil:
        cdef uintptr_t lines = self._lines(self.me, peer)
        cdef Py_ssize_t total = _chunks(nbytes, self.payload), offset, n
        cdef int64_t end = arch.shmcoll_now_ns() + slice_ns if slice_ns > 0 else 0
        cdef int64_t *half
        cdef uint32_t chunk
        while done < total:
            chunk = self.posted[peer]
            if not self._wait(lines, 1, chunk - 1, end, spin_ns, yield_ns, yield_company):
                break  # the half still holds chunk - 2, not yet taken
            half = self._half(self.me, peer, chunk)
            offset = done * self.payload
            n = nbytes - offset if nbytes - offset < self.payload else self.payload
            half[0], half[1], half[2], half[3], half[4] = tag, nbytes, offset, n, 0
            memcpy(<char *>half + _HEADER, addr + offset, n)
            self.posted[peer] = chunk + 1
            _post(lines, 0, chunk + 1, 0)
            done += 1
        return done

    def post_address(self, int peer, uintptr_t addr, Py_ssize_t nbytes, int64_t tag) -> int:
        """Post one chunk that gives ``peer`` the address of the whole message (single copy), if its half is
        free: the count of chunks ``peer`` has taken once it has read the message; else -1."""
        cdef uintptr_t lines = self._lines(self.me, peer)
        cdef uint32_t chunk = self.posted[peer]
        cdef int64_t *half
        if not self._wait(lines, 1, chunk - 1, 0, 0, 0, 0):
            return -1
        half = self._half(self.me, peer, chunk)
        half[0], half[1], half[2], half[3], half[4] = tag, nbytes, 0, _DIRECT, <int64_t>addr
        self.posted[peer] = chunk + 1
        _post(lines, 0, chunk + 1, 0)
        return chunk + 1

    def taken_by(self, int peer, uint32_t target) -> bool:
        """Whether ``peer`` has taken ``target`` chunks from this rank."""
        return arch.shmcoll_reached(arch.shmcoll_load_acquire_u32(_step_word(self._lines(self.me, peer), 1)),
                                    target)

    def send_target(self, int peer):
        """(lines, line, step) a send to ``peer`` that found no free half waits for."""
        return self._lines(self.me, peer), 1, <uint32_t>(self.posted[peer] - 1)

    # -- the receiver ----------------------------------------------------------

    def recv(self, int peer, uintptr_t addr, Py_ssize_t nbytes, int64_t tag, Py_ssize_t done, int64_t slice_ns,
             int64_t spin_ns, int64_t yield_ns, int yield_company=0) -> int:
        """Take the chunks of a message of ``nbytes`` with ``tag`` from ``peer`` into ``addr`` from its chunk
        ``done`` on, as far as they have come, waiting for them up to ``slice_ns``: the message's chunks taken;
        MISMATCH where the next chunk is another message's, DIRECT_CHUNK where it gives an address."""
        with nogil:
            done = self._recv(peer, <char *>addr, nbytes, tag, done, slice_ns, spin_ns, yield_ns, yield_company)
        return done

    cdef Py_ssize_t _recv(self, int peer, char *addr, Py_ssize_t nbytes, int64_t tag, Py_ssize_t done,
                          int64_t slice_ns, int64_t spin_ns, int64_t yield_ns, int yield_company) noexcept nogil:
        cdef uintptr_t lines = self._lines(peer, self.me)
        cdef Py_ssize_t total = _chunks(nbytes, self.payload), offset, n
        cdef int64_t end = arch.shmcoll_now_ns() + slice_ns if slice_ns > 0 else 0
        cdef int64_t *half
        cdef uint32_t chunk
        while done < total:
            chunk = self.taken[peer]
            if not self._wait(lines, 0, chunk + 1, end, spin_ns, yield_ns, yield_company):
                break
            half = self._half(peer, self.me, chunk)
            offset = done * self.payload
            n = nbytes - offset if nbytes - offset < self.payload else self.payload
            if half[0] != tag or half[1] != nbytes or half[2] != offset:
                return _MISMATCH
            if half[3] == _DIRECT:
                return _DIRECT_CHUNK
            if half[3] != n:
                return _MISMATCH
            memcpy(addr + offset, <char *>half + _HEADER, n)
            self.taken[peer] = chunk + 1
            _post(lines, 1, chunk + 1, 0)
            done += 1
        return done

    def ready(self, int peer) -> bool:
        """Whether a chunk from ``peer`` waits to be taken."""
        return arch.shmcoll_reached(arch.shmcoll_load_acquire_u32(_step_word(self._lines(peer, self.me), 0)),
                                    self.taken[peer] + 1)

    def next_header(self, int peer) -> tuple:
        """(tag, message bytes, offset, chunk bytes, address) of the chunk from ``peer`` to be taken next."""
        cdef int64_t *half = self._half(peer, self.me, self.taken[peer])
        return half[0], half[1], half[2], half[3], half[4]

    def take(self, int peer) -> None:
        """Mark the next chunk from ``peer`` taken (an address chunk, once its message is read)."""
        cdef uint32_t chunk = self.taken[peer] + 1
        self.taken[peer] = chunk
        _post(self._lines(peer, self.me), 1, chunk, 0)

    def recv_target(self, int peer):
        """(lines, line, step) a receive from ``peer`` waits for."""
        return self._lines(peer, self.me), 0, <uint32_t>(self.taken[peer] + 1)


cdef class SmallTransfers:
    """The group's ``send`` and ``recv`` of one node run here, where a call is one plain contiguous CPU tensor
    whose message moves whole at once (a send the channel's free halves hold, a receive whose every chunk has
    come) while nothing else is pending, no profiler is on and the group is usable; else None, and the
    Python path (``shmcoll.p2p``) queues it, checks it or raises. It moves under the p2p engine's lock, as
    ``PointToPoint.start`` does, and makes the same Work (``completed(result, source)``)."""

    cdef Channels channels
    cdef GroupState state
    cdef Backlog backlog
    cdef object ranks, lock, tensor_type, strided, profiling, completed
    cdef readonly Py_ssize_t taken  # calls this path ran (tests check which path ran)

    def __init__(self, *, GroupState state, Backlog backlog, ranks, Channels channels, lock, tensor_type, strided,
                 profiling, completed):
        self.state = state  # its error: the one that made the group unusable
        self.backlog = backlog  # the point-to-point engine's pending transfers, read under ``lock``
        self.ranks = ranks  # the group rank of each local rank (a receive's source)
        self.channels = channels
        self.lock = lock
        self.tensor_type = tensor_type
        self.strided = strided
        self.profiling = profiling  # whether a profiler is on: the Python path records the event
        self.completed = completed

    cdef inline bint _plain(self, tensor):
        """As the compiled collectives' (``front.pxi``): no lazily negated or conjugated view, which the Python
        path reads and writes through stand-ins."""
        return (type(tensor) is self.tensor_type and tensor.is_cpu and tensor.layout is self.strided
                and tensor.is_contiguous() and not tensor.is_neg() and not tensor.is_conj())

    cdef object _tensor(self, tensors, peer, tag):
        """The call's one tensor, where this path may take it; else None."""
        if type(tensors) is not list or len(<list>tensors) != 1 or type(peer) is not int or type(tag) is not int:
            return None
        tensor = (<list>tensors)[0]
        if not self._plain(tensor) or peer < 0 or peer >= self.channels.size or peer == self.channels.me:
            return None
        if self.state.error is not None or self.profiling():
            return None
        return tensor

    def send(self, tensors, dst, tag):
        """``group.send(tensors, dst, tag)`` finished at once, or None."""
        tensor = self._tensor(tensors, dst, tag)
        if tensor is None:
            return None
        cdef Channels channels = self.channels
        cdef int peer = dst
        cdef Py_ssize_t nbytes = tensor.nbytes, total = _chunks(nbytes, channels.payload)
        cdef uintptr_t addr = tensor.data_ptr()
        cdef int64_t tag_value = tag
        cdef uintptr_t lines = channels._lines(channels.me, peer)
        self.lock.acquire()  # held briefly by the others: never across a wait
        try:
            # every chunk's half free: the receiver has taken all the channel's chunks but the last 2 - total
            if (not self.backlog.idle() or total > 2 or not arch.shmcoll_reached(
                    arch.shmcoll_load_acquire_u32(_step_word(lines, 1)), channels.posted[peer] + total - 2)):
                return None
            with nogil:
                channels._send(peer, <char *>addr, nbytes, tag_value, 0, 0, 0, 0, 0)
        finally:
            self.lock.release()
        self.taken += 1
        return self.completed(tensors, -1)

    def recv(self, tensors, src, tag):
        """``group.recv(tensors, src, tag)`` finished at once, or None (also where the next message is another
        one, or given by address: the Python path raises, or reads it)."""
        tensor = self._tensor(tensors, src, tag)
        if tensor is None:
            return None
        cdef Channels channels = self.channels
        cdef int peer = src
        cdef Py_ssize_t nbytes = tensor.nbytes, total = _chunks(nbytes, channels.payload), got
        cdef uintptr_t addr = tensor.data_ptr()
        cdef int64_t tag_value = tag
        cdef uintptr_t lines = channels._lines(peer, channels.me)
        self.lock.acquire()  # held briefly by the others: never across a wait
        try:
            # every chunk has come; a mismatch or an address is found at the first, before anything is taken
            if (not self.backlog.idle() or not arch.shmcoll_reached(
                    arch.shmcoll_load_acquire_u32(_step_word(lines, 0)), channels.taken[peer] + total)):
                return None
            with nogil:
                got = channels._recv(peer, <char *>addr, nbytes, tag_value, 0, 0, 0, 0, 0)
        finally:
            self.lock.release()
        if got != total:
            return None
        self.taken += 1
        return self.completed(tensors, self.ranks[peer])
