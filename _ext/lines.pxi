# Control-line primitives shared by the Cython modules that wait on steps
# (sync.pyx for Python callers, schedules.pyx and single_copy.pyx for whole schedules run in C, p2p.pyx for
# point-to-point chunks).
# Textually included: every function here inlines into its caller.
# Terms: see sync.pyx.
from libc.stdint cimport uint32_t, uint64_t, int64_t, uintptr_t
cimport arch

cdef extern from "<sched.h>" nogil:
    int sched_yield()

from schedule cimport _LINE, _DESC, _PID, _CPU, _ADDRESS, _STANDING  # the control line's layout


cdef inline uint32_t *_step_word(uintptr_t lines, int rank) noexcept nogil:
    return <uint32_t *>(lines + <uintptr_t>rank * _LINE)


cdef inline uint32_t *_cpu_word(uintptr_t lines, int rank) noexcept nogil:
    return <uint32_t *>(lines + <uintptr_t>rank * _LINE + _CPU)


cdef inline uint64_t *_desc_slot(uintptr_t lines, int rank, uint32_t step) noexcept nogil:
    return <uint64_t *>(<char *>_step_word(lines, rank) + _DESC + 8 * (step & 3))



cdef inline void _post(uintptr_t lines, int rank, uint32_t step, uint64_t desc) noexcept nogil:
    cdef uint32_t *word = _step_word(lines, rank)
    arch.shmcoll_store_release_u64(_desc_slot(lines, rank, step), desc)
    arch.shmcoll_store_seq_cst_u32(word, step)
    if arch.shmcoll_load_seq_cst_u32(word + 1) != 0:
        arch.shmcoll_futex_wake_all(word)


cdef inline bint _record_cpu_find_company(uintptr_t lines, int size, int me) noexcept nogil:
    """Record the CPU this thread waits on in ``me``'s line (if ``me`` >= 0), and say whether one of the
    first ``size`` ranks on these lines but ``me`` last waited on it: only then can a sched_yield hand
    the core to a peer."""
    cdef uint32_t cpu = arch.shmcoll_cpu()
    cdef int r
    if me >= 0:
        arch.shmcoll_store_release_u32(_cpu_word(lines, me), cpu)
    for r in range(size):
        if r != me and arch.shmcoll_load_acquire_u32(_cpu_word(lines, r)) == cpu:
            return True
    return False


cdef inline int _wait_one(uint32_t *word, uint32_t target, int64_t spin_until,
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



cdef inline int _wait_ranks(uintptr_t lines, int first, int stop, int skip, uint32_t target,
                            int64_t spin_ns, int64_t yield_ns, int64_t slice_ns, int yield_company) noexcept nogil:
    """-1 once every rank in [first, stop) but ``skip`` has reached target; else the first still behind.

    ``yield_company`` > 0 (local ranks outnumber the cores): yield only while one of the first
    ``yield_company`` ranks but ``skip`` (this one) last waited on this thread's CPU. Alone on its core a
    rank's yields return at once, so it sleeps instead: the core goes idle, and the kernel moves a rank
    there from a crowded core within milliseconds, where it leaves a core of yielding ranks alone for
    tens of them (it does not move a task that ran in the last half millisecond).
    """
    cdef int64_t start = arch.shmcoll_now_ns()
    cdef int r
    if yield_company > 0 and yield_ns > 0 and not _record_cpu_find_company(lines, yield_company, skip):
        yield_ns = 0
    for r in range(first, stop):
        if r != skip and not _wait_one(_step_word(lines, r), target, start + spin_ns,
                                       start + spin_ns + yield_ns, start + slice_ns):
            return r
    return -1


cdef inline int _first_mismatch(uintptr_t lines, int first, int stop, uint32_t step, uint64_t desc) noexcept nogil:
    """First rank in [first, stop) that published exactly ``step`` with another descriptor; -1 if none."""
    cdef int r
    for r in range(first, stop):
        if arch.shmcoll_load_acquire_u32(_step_word(lines, r)) == step and \
                arch.shmcoll_load_acquire_u64(_desc_slot(lines, r, step)) != desc:
            return r
    return -1
