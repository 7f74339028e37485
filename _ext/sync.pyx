# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Waiting on and signalling process-shared control words.

Terms (used across shmcoll):
  control line  one 128-byte record per rank in the arena (two cache lines, so
                adjacent-line prefetch cannot cause false sharing). It starts
                with the rank's *step* word (uint32, the futex word) and the
                count of processes sleeping on it (uint32), then four 64-bit
                descriptors of the collective each step belongs to, in slot
                step % 4: a peer one or two steps ahead writes another slot,
                so a rank checking step s never reads a later step's
                descriptor (it writes the descriptor before the step word).
  step          a per-rank sequence number, bumped each time the rank publishes
                data (release store). A peer "has reached" step s once its word
                is >= s (wrap-safe).

Waiting spins with a pause instruction for ``spin_ns``, then spins with
``sched_yield`` for ``yield_ns`` (lets an oversubscribed core run the peer we
wait for), then sleeps on the futex. The caller passes a slice length; when it
expires the call returns so that Python can check deadlines and liveness
without ever running inside the hot loop.
"""
from libc.stdint cimport uint32_t, uint64_t, int64_t, uintptr_t
from posix.types cimport pid_t
cimport arch

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<signal.h>" nogil:
    int kill(pid_t pid, int sig)

cdef extern from "<errno.h>" nogil:
    int errno
    int ESRCH

# Byte offsets inside a control line.
LINE_BYTES = 128
STEP_OFFSET = 0
WAITERS_OFFSET = 4
DESC_OFFSET = 8  # four uint64 slots, up to byte 40

cdef enum:
    _LINE = 128
    _DESC = 8


cdef inline uint32_t *_step_word(uintptr_t lines, int rank) noexcept nogil:
    return <uint32_t *>(lines + <uintptr_t>rank * _LINE)


cdef inline uint64_t *_desc_slot(uintptr_t lines, int rank, uint32_t step) noexcept nogil:
    return <uint64_t *>(<char *>_step_word(lines, rank) + _DESC + 8 * (step & 3))


def post(uintptr_t lines, int rank, uint32_t step, uint64_t desc):
    """Publish ``step`` (and its collective descriptor) for ``rank``, waking sleepers."""
    cdef uint32_t *word = _step_word(lines, rank)
    arch.shmcoll_store_release_u64(_desc_slot(lines, rank, step), desc)
    arch.shmcoll_store_seq_cst_u32(word, step)
    if arch.shmcoll_load_seq_cst_u32(word + 1) != 0:
        arch.shmcoll_futex_wake_all(word)


def load_step(uintptr_t lines, int rank):
    """The step ``rank`` has published (acquire load)."""
    return arch.shmcoll_load_acquire_u32(_step_word(lines, rank))


def load_desc(uintptr_t lines, int rank, uint32_t step):
    """The descriptor ``rank`` published with ``step`` (valid while it is at most 2 steps past it)."""
    return arch.shmcoll_load_acquire_u64(_desc_slot(lines, rank, step))


def wake(uintptr_t lines, int rank):
    """Wake every process sleeping on ``rank``'s step word (used on abort)."""
    arch.shmcoll_futex_wake_all(_step_word(lines, rank))


cdef int _wait_one(uint32_t *word, uint32_t target, int64_t spin_until,
                   int64_t yield_until, int64_t slice_end) noexcept nogil:
    """1 once *word has reached target, 0 if the slice ended first."""
    cdef int64_t now
    cdef int i
    cdef uint32_t seen
    # Spin: the common case on an idle core, where the peer is microseconds away.
    while True:
        for i in range(64):
            if arch.shmcoll_reached(arch.shmcoll_load_acquire_u32(word), target):
                return 1
            arch.shmcoll_cpu_relax()
        now = arch.shmcoll_now_ns()
        if now >= spin_until or now >= slice_end:
            break
    # Yield: another runnable rank on this core gets the CPU at once.
    while True:
        if arch.shmcoll_reached(arch.shmcoll_load_acquire_u32(word), target):
            return 1
        now = arch.shmcoll_now_ns()
        if now >= yield_until or now >= slice_end:
            break
        sched_yield()
    # Sleep on the futex; the poster wakes us only if it sees waiters > 0.
    arch.shmcoll_fetch_add_u32(word + 1, 1)
    while True:
        seen = arch.shmcoll_load_seq_cst_u32(word)
        if arch.shmcoll_reached(seen, target):
            arch.shmcoll_fetch_sub_u32(word + 1, 1)
            return 1
        now = arch.shmcoll_now_ns()
        if now >= slice_end:
            arch.shmcoll_fetch_sub_u32(word + 1, 1)
            return 0
        arch.shmcoll_futex_wait(word, seen, slice_end - now)


def wait_ranks(uintptr_t lines, int first, int stop, int skip, uint32_t target,
               int64_t spin_ns, int64_t yield_ns, int64_t slice_ns):
    """Wait until every rank in [first, stop) except ``skip`` has reached ``target``.

    Returns -1 when all have; otherwise, when ``slice_ns`` has passed, the
    first rank still behind. The GIL is released throughout.
    """
    cdef int r
    cdef int64_t start, spin_until, yield_until, slice_end
    cdef int ok = 1
    with nogil:
        start = arch.shmcoll_now_ns()
        spin_until = start + spin_ns
        yield_until = spin_until + yield_ns
        slice_end = start + slice_ns
        r = first
        while r < stop:
            if r != skip:
                ok = _wait_one(_step_word(lines, r), target, spin_until, yield_until, slice_end)
                if not ok:
                    break
            r += 1
    return -1 if ok else r


def wait_rank(uintptr_t lines, int rank, uint32_t target,
              int64_t spin_ns, int64_t yield_ns, int64_t slice_ns):
    """Wait until ``rank`` has reached ``target``; True, or False when the slice ended."""
    cdef int ok
    cdef int64_t start
    with nogil:
        start = arch.shmcoll_now_ns()
        ok = _wait_one(_step_word(lines, rank), target, start + spin_ns,
                       start + spin_ns + yield_ns, start + slice_ns)
    return bool(ok)


def first_mismatch(uintptr_t lines, int first, int stop, uint32_t step, uint64_t desc):
    """First rank in [first, stop) whose published step is exactly ``step`` but
    whose descriptor differs from ``desc`` (a different collective); -1 if none."""
    cdef int r
    cdef uint32_t *word
    for r in range(first, stop):
        word = _step_word(lines, r)
        if arch.shmcoll_load_acquire_u32(word) == step and \
                arch.shmcoll_load_acquire_u64(_desc_slot(lines, r, step)) != desc:
            return r
    return -1


def process_alive(int pid):
    """False only if no process ``pid`` exists (kill(pid, 0) fails with ESRCH)."""
    if kill(pid, 0) == 0:
        return True
    return errno != ESRCH
