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
wait for), then sleeps on the futex. Where local ranks outnumber the cores, a
wait yields only while another local rank shares its core (``yield_company``,
lines.pxi). The caller passes a slice length; when it expires the call returns
so that Python can check deadlines and liveness without ever running inside the
hot loop.
"""
from posix.types cimport pid_t

include "lines.pxi"

cdef extern from "<signal.h>" nogil:
    int kill(pid_t pid, int sig)

cdef extern from "<errno.h>" nogil:
    int errno
    int ESRCH

# The control line's layout (schedule.pxd), for the arena's Python side.
LINE_BYTES = _LINE
PID_OFFSET = _PID
STANDING_OFFSET = _STANDING


def post(uintptr_t lines, int rank, uint32_t step, uint64_t desc):
    """Publish ``step`` (and its collective descriptor) for ``rank``, waking sleepers."""
    _post(lines, rank, step, desc)


def load_step(uintptr_t lines, int rank):
    """The step ``rank`` has published (acquire load)."""
    return arch.shmcoll_load_acquire_u32(_step_word(lines, rank))


def load_desc(uintptr_t lines, int rank, uint32_t step):
    """The descriptor ``rank`` published with ``step`` (valid while it is at most 2 steps past it)."""
    return arch.shmcoll_load_acquire_u64(_desc_slot(lines, rank, step))


def wait_ranks(uintptr_t lines, int first, int stop, int skip, uint32_t target,
               int64_t spin_ns, int64_t yield_ns, int64_t slice_ns, int yield_company=0):
    """Wait until every rank in [first, stop) except ``skip`` (this rank, if among them) has reached
    ``target``.

    Returns -1 when all have; otherwise, when ``slice_ns`` has passed, the
    first rank still behind. The GIL is released throughout.
    """
    cdef int behind
    with nogil:
        behind = _wait_ranks(lines, first, stop, skip, target, spin_ns, yield_ns, slice_ns, yield_company)
    return behind


def wait_rank(uintptr_t lines, int rank, uint32_t target,
              int64_t spin_ns, int64_t yield_ns, int64_t slice_ns, int me=-1, int yield_company=0):
    """Wait until ``rank`` has reached ``target``; True, or False when the slice ended. ``me``: this
    rank's line (for ``yield_company``)."""
    cdef int behind
    cdef int skip = -1 if me == rank else me  # never skip the rank waited for
    with nogil:
        behind = _wait_ranks(lines, rank, rank + 1, skip, target, spin_ns, yield_ns, slice_ns, yield_company)
    return behind < 0


def first_mismatch(uintptr_t lines, int first, int stop, uint32_t step, uint64_t desc):
    """First rank in [first, stop) whose published step is exactly ``step`` but
    whose descriptor differs from ``desc`` (a different collective); -1 if none."""
    return _first_mismatch(lines, first, stop, step, desc)


def process_alive(int pid):
    """False only if no process ``pid`` exists (kill(pid, 0) fails with ESRCH)."""
    if kill(pid, 0) == 0:
        return True
    return errno != ESRCH
