# Lanes: one collective's schedule split over several threads of a rank, fanned out and joined in C.
# Textually included by schedules.pyx, after the collectives' .pxi files.
#
# A pool belongs to one group's arena: lane j has its own control lines and its own slots (its sched_t), and
# thread j of every rank of the node drives lane j of every collective that uses it, so threads of one rank
# never wait for each other mid-collective, only for their lane on the peers. The caller's thread drives lane
# 0; the pool's threads (pthreads: no Python, no GIL) drive the others. A worker that finishes a lane polls
# for the next job for ``idle_spin_ns`` (the next collective of a burst finds it awake), then sleeps on a
# futex of its own, so an idle pool holds no core.
#
# The pool also runs local work that waits for no peer (``pool_for``: single copy's reads and reductions,
# between meetings the caller keeps), each of the first n lanes a part of it.
#
# A lane's waits are slices, as every wait's: between slices a worker only looks whether the collective was
# cancelled; the caller (Python, shmcoll.lanes) looks at what every lane waits for between its own slices
# and decides as every other wait does (dead peers, abort, timeout: shmcoll.waits), and cancels the pool
# when it gives up.

cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    int pthread_create(pthread_t *thread, const void *attr, void *(*start)(void *) noexcept nogil, void *arg)
    int pthread_join(pthread_t thread, void **retval)
    pthread_t pthread_self()
    int pthread_setname_np(pthread_t thread, const char *name)

cdef extern from "<stdio.h>" nogil:
    int snprintf(char *s, size_t n, const char *fmt, ...)

cdef extern from "<stdlib.h>" nogil:
    int posix_memalign(void **memptr, size_t alignment, size_t size)
    void free(void *ptr)

cdef extern from "<string.h>" nogil:
    void *memset(void *s, int c, size_t n)

cdef extern from "<unistd.h>" nogil:
    int getpid()

# A lane's progress besides the schedules' own statuses (schedule.pxd): not started, and waiting for every
# rank to reach the step its previous collective ended on before reusing its buffers.
cdef enum:
    LANE_STARTING = -10
    LANE_WAITING_BASE = -11

# The pool's kinds (shmcoll/_schedules.pxd), and the all-reduce's that never splits.
ONE_SHOT, CHUNKED, REDUCE_SCATTER, ALLGATHER, BROADCAST = (KIND_ONE_SHOT, KIND_CHUNKED, KIND_REDUCE_SCATTER,
                                                           KIND_ALLGATHER, KIND_BROADCAST)
ONE_SHOT_STEPS = KIND_ONE_SHOT_STEPS
CANCELLED = STATUS_CANCELLED

ctypedef struct job_t:
    int kind
    uint64_t desc
    uintptr_t addr, out
    Py_ssize_t itemsize  # bytes of the items lo and hi count (1 for the kinds that move bytes)
    Py_ssize_t block_stride  # reduce-scatter: items from one block to the next
    bint direct  # reduce-scatter: the output is apart from the input (reduce_scatter.pxi)
    Py_ssize_t out_stride  # all-gather: bytes from one rank's block of the output to the next
    uintptr_t blocks  # all-gather: a table of its blocks' addresses (the list form), or 0 (allgather.pxi)
    kernel_t kernel
    int64_t op
    double scale
    int root
    task_t task  # KIND_TASK
    void *ctx

ctypedef struct lane_t:
    sched_t *s  # the lane's steps and slots
    void *pool
    int index
    Py_ssize_t lo, hi  # its part of the message, in items
    uint32_t base  # the step before its first in this collective
    uint32_t waiting  # while status >= 0 or LANE_WAITING_BASE: the step it waits for every rank to reach
    int64_t status  # LANE_*, or a schedule's status (a position >= 0: that wait's slice expired)
    uint32_t go  # futex word of a worker: the caller bumps it for each job
    uint32_t asleep  # the worker sleeps (or is about to) on ``go``
    pthread_t thread
    char pad[64]  # no two lanes' words on one cache line

ctypedef struct pool_t:
    job_t job
    lane_t *lanes[MAX_POOL_LANES]
    int count  # lanes: the caller's and count - 1 workers
    int threads  # workers started (lanes 1..threads have one)
    int active  # lanes of the collective in progress
    uint32_t pending  # workers still running it
    uint32_t finished  # futex word of the caller: bumped when ``pending`` reaches 0
    uint32_t caller_asleep
    uint32_t cancel  # every lane stops at its next slice (an error, here or on a peer)
    uint32_t stop  # the workers exit
    int64_t idle_spin_ns  # how long a worker polls for the next job before it sleeps
    int creator  # pid of the process whose threads these are (a forked child has none)


cdef inline int64_t _load_status(lane_t *lane) noexcept nogil:
    return <int64_t>arch.shmcoll_load_acquire_u64(<uint64_t *>&lane.status)


cdef inline void _store_status(lane_t *lane, int64_t status) noexcept nogil:
    arch.shmcoll_store_release_u64(<uint64_t *>&lane.status, <uint64_t>status)


cdef inline bint _final(int64_t status) noexcept nogil:
    return status == STATUS_DONE or status == STATUS_MISMATCH or status == STATUS_CANCELLED


cdef Py_ssize_t _call(job_t *job, lane_t *lane, Py_ssize_t resume) noexcept nogil:
    """One call of the job's schedule over the lane's part (``resume`` as the schedules take it)."""
    cdef sched_t *s = lane.s
    cdef Py_ssize_t n = lane.hi - lane.lo
    cdef Py_ssize_t size = job.itemsize
    cdef char *addr = <char *>(job.addr + lane.lo * size)
    if job.kind == KIND_ONE_SHOT:
        return one_shot(s, lane.base + 1, job.desc, addr, n, <int>size, job.kernel, job.op, job.scale, resume >= 0)
    if job.kind == KIND_CHUNKED:
        return chunked(s, lane.base, job.desc, addr, n, <int>size, job.kernel, job.op, job.scale, job.root, resume)
    if job.kind == KIND_REDUCE_SCATTER:
        return reduce_scatter(s, lane.base, job.desc, addr, n, job.block_stride, <int>size,
                              <char *>(job.out + lane.lo * size), job.direct, job.kernel, job.op, job.scale,
                              resume)
    if job.kind == KIND_ALLGATHER:
        return allgather(s, lane.base, job.desc, addr, n, <char *>(job.out + lane.lo), job.out_stride,
                         <const uintptr_t *>job.blocks, resume)
    return broadcast(s, lane.base, job.desc, addr, n, job.root, resume)


cdef int _advance(pool_t *pool, lane_t *lane, bint once) noexcept nogil:
    """Run ``lane`` until it ends (1); with ``once``, return 0 as soon as a wait of it outlasts a slice."""
    cdef sched_t *s = lane.s
    cdef int64_t status = lane.status
    cdef Py_ssize_t resume
    while not _final(status):
        if status == LANE_STARTING:
            lane.base = s.posted
            if s.reached == s.posted:
                status = _call(&pool.job, lane, -1)
                continue
            status = LANE_WAITING_BASE  # the last collective ended before every rank reached its last step
        if status == LANE_WAITING_BASE:
            lane.waiting, resume = lane.base, -1
        else:
            lane.waiting, resume = lane.base + <uint32_t>status + 1, status
        _store_status(lane, status)
        if once:
            return 0
        if _wait_ranks(s.lines, 0, s.size, s.me, lane.waiting, 0, 0, s.slice_ns, 0) < 0:
            s.reached = lane.waiting
            status = _call(&pool.job, lane, resume)
        elif arch.shmcoll_load_acquire_u32(&pool.cancel):
            status = STATUS_CANCELLED
    if status == STATUS_MISMATCH:
        arch.shmcoll_store_seq_cst_u32(&pool.cancel, 1)  # the other lanes need not wait for theirs
    _store_status(lane, status)
    return 1


cdef int _resume_caller(pool_t *pool) noexcept nogil:
    """Lane 0 (the caller's) one slice further: a wait that expired is waited for one more slice and, once
    reached, its schedule resumed. 1 once lane 0 has ended."""
    cdef lane_t *lane = pool.lanes[0]
    cdef sched_t *s = lane.s
    cdef int64_t status = lane.status
    cdef Py_ssize_t resume
    if _final(status):
        return 1
    if status != LANE_STARTING:
        resume = -1 if status == LANE_WAITING_BASE else status
        if _wait_ranks(s.lines, 0, s.size, s.me, lane.waiting, 0, 0, s.slice_ns, 0) >= 0:
            if arch.shmcoll_load_acquire_u32(&pool.cancel):
                _store_status(lane, STATUS_CANCELLED)
                return 1
            return 0
        s.reached = lane.waiting
        lane.status = _call(&pool.job, lane, resume)
    return _advance(pool, lane, True)


cdef uint32_t _next_job(pool_t *pool, lane_t *lane, uint32_t seen) noexcept nogil:
    """A worker's wait for its next job (or the pool's end): poll for ``idle_spin_ns``, then sleep."""
    cdef int64_t until = arch.shmcoll_now_ns() + pool.idle_spin_ns
    cdef uint32_t go
    cdef int i
    while True:
        for i in range(64):
            go = arch.shmcoll_load_acquire_u32(&lane.go)
            if go != seen:
                return go
            arch.shmcoll_cpu_relax()
        if arch.shmcoll_now_ns() >= until:
            break
    arch.shmcoll_store_seq_cst_u32(&lane.asleep, 1)
    while True:
        go = arch.shmcoll_load_seq_cst_u32(&lane.go)
        if go != seen:
            break
        arch.shmcoll_futex_wait(&lane.go, seen, 1000000000)
    arch.shmcoll_store_seq_cst_u32(&lane.asleep, 0)
    return go


cdef void *_worker(void *arg) noexcept nogil:
    cdef lane_t *lane = <lane_t *>arg
    cdef pool_t *pool = <pool_t *>lane.pool
    cdef uint32_t seen = 0
    cdef char name[16]
    snprintf(name, 16, "shmcoll-lane%d", lane.index)  # what ps, top and /proc/PID/task/*/comm show
    pthread_setname_np(pthread_self(), name)
    while True:
        seen = _next_job(pool, lane, seen)
        if arch.shmcoll_load_acquire_u32(&pool.stop):
            return NULL
        if pool.job.kind == KIND_TASK:
            pool.job.task(pool.job.ctx, lane.lo, lane.hi, lane.index)
            _store_status(lane, STATUS_DONE)
        else:
            _advance(pool, lane, False)
        if arch.shmcoll_fetch_sub_u32(&pool.pending, 1) == 1:
            arch.shmcoll_fetch_add_u32(&pool.finished, 1)
            if arch.shmcoll_load_seq_cst_u32(&pool.caller_asleep):
                arch.shmcoll_futex_wake_all(&pool.finished)


cdef int _join(pool_t *pool, int64_t spin_ns, int64_t slice_ns) noexcept nogil:
    """Wait (one slice at most) for the workers to end their lanes: 1 once they all have."""
    cdef int64_t start = arch.shmcoll_now_ns()
    cdef int64_t now
    cdef uint32_t seen
    cdef int i
    while arch.shmcoll_load_acquire_u32(&pool.pending) != 0:
        for i in range(64):
            arch.shmcoll_cpu_relax()
        if arch.shmcoll_now_ns() - start >= spin_ns:
            break
    arch.shmcoll_store_seq_cst_u32(&pool.caller_asleep, 1)
    while True:
        seen = arch.shmcoll_load_seq_cst_u32(&pool.finished)
        if arch.shmcoll_load_seq_cst_u32(&pool.pending) == 0:
            arch.shmcoll_store_seq_cst_u32(&pool.caller_asleep, 0)
            return 1
        now = arch.shmcoll_now_ns()
        if now - start >= slice_ns:
            arch.shmcoll_store_seq_cst_u32(&pool.caller_asleep, 0)
            return 0
        arch.shmcoll_futex_wait(&pool.finished, seen, slice_ns - (now - start))


cdef void _fan_out(pool_t *pool, int lanes, Py_ssize_t count, Py_ssize_t align) noexcept nogil:
    """Give the job of ``pool.job`` to its first ``lanes`` lanes, lane j the j-th of ``lanes`` stretches of
    [0, ``count``), each starting at a multiple of ``align``, and wake the workers among them."""
    cdef int j
    cdef lane_t *lane
    for j in range(pool.count):
        lane = pool.lanes[j]
        if j < lanes:
            lane.lo = count * j // lanes // align * align
            lane.hi = count if j == lanes - 1 else count * (j + 1) // lanes // align * align
            lane.status = LANE_STARTING
        else:
            lane.status = STATUS_DONE
    pool.active = lanes
    arch.shmcoll_store_seq_cst_u32(&pool.cancel, 0)
    arch.shmcoll_store_seq_cst_u32(&pool.pending, lanes - 1)
    for j in range(1, lanes):
        lane = pool.lanes[j]
        arch.shmcoll_fetch_add_u32(&lane.go, 1)
        if arch.shmcoll_load_seq_cst_u32(&lane.asleep):
            arch.shmcoll_futex_wake_all(&lane.go)


cdef void pool_for(void *memory, int lanes, task_t task, void *ctx, Py_ssize_t count,
                   Py_ssize_t align) noexcept nogil:
    """``task`` over [0, ``count``) on the first ``lanes`` lanes of the pool at ``memory`` (at most its
    count), the caller's thread doing lane 0's part; returns once every part is done. The task waits for no
    peer, so neither does the join beyond the task's own time."""
    cdef pool_t *pool = <pool_t *>memory
    if lanes <= 1 or pool == NULL:
        task(ctx, 0, count, 0)
        return
    if lanes > pool.count:
        lanes = pool.count
    pool.job.kind, pool.job.task, pool.job.ctx = KIND_TASK, task, ctx
    _fan_out(pool, lanes, count, align)
    task(ctx, pool.lanes[0].lo, pool.lanes[0].hi, 0)
    pool.lanes[0].status = STATUS_DONE
    while not _join(pool, pool.lanes[0].s.spin_ns, pool.lanes[0].s.slice_ns):
        pass


cdef int pool_start(void *memory, int kind, int lanes, uint64_t desc, uintptr_t addr, uintptr_t out,
                    Py_ssize_t count, Py_ssize_t itemsize, Py_ssize_t align, Py_ssize_t block_stride,
                    Py_ssize_t out_stride, uintptr_t blocks, kernel_t kernel, int64_t op, double scale,
                    int root) noexcept nogil:
    """One collective over the first ``lanes`` (1 to the pool's count) lanes of the pool at ``memory``: lane j
    takes the j-th of ``lanes`` stretches of [0, ``count``) items, each starting at a multiple of ``align``
    items; the caller's thread runs lane 0 until a wait of it outlasts a slice, then joins the workers for at
    most a slice. 2 once every lane ended DONE, 1 once every lane ended, 0 while one still runs."""
    cdef pool_t *pool = <pool_t *>memory
    cdef int j
    pool.job.kind, pool.job.desc, pool.job.addr, pool.job.out = kind, desc, addr, out
    pool.job.itemsize, pool.job.block_stride, pool.job.out_stride = itemsize, block_stride, out_stride
    pool.job.blocks = blocks
    pool.job.kernel, pool.job.op, pool.job.scale, pool.job.root = kernel, op, scale, root
    pool.job.direct = apart(out, addr, count, block_stride, itemsize, pool.lanes[0].s.size)
    _fan_out(pool, lanes, count, align)
    if not (_advance(pool, pool.lanes[0], True) and _join(pool, pool.lanes[0].s.spin_ns, pool.lanes[0].s.slice_ns)):
        return 0
    for j in range(lanes):
        if pool.lanes[j].status != STATUS_DONE:
            return 1
    return 2


cdef class Pool:
    """The lanes of one arena and the threads that drive lanes 1..n-1 (see the comment at the top).

    ``schedules``: one Schedule per lane, over the lane's lines and slots; ``idle_spin_ns``: how long a
    worker polls for the next job before it sleeps.
    """

    cdef pool_t *pool
    cdef list schedules  # kept alive: the lanes point into them
    cdef readonly int count

    def __cinit__(self, list schedules, int64_t idle_spin_ns):
        cdef int j, count = len(schedules)
        cdef void *memory
        cdef lane_t *lane
        if not 1 <= count <= MAX_POOL_LANES:
            raise ValueError(f"a pool has 1 to {MAX_POOL_LANES} lanes, not {count}")
        if posix_memalign(&memory, 64, sizeof(pool_t)) != 0:
            raise MemoryError()
        self.pool = <pool_t *>memory
        memset(self.pool, 0, sizeof(pool_t))
        self.pool.idle_spin_ns = idle_spin_ns
        self.pool.creator = getpid()
        self.schedules = schedules
        self.count = count
        for j in range(count):
            if posix_memalign(&memory, 64, sizeof(lane_t)) != 0:
                self._free()
                raise MemoryError()
            lane = <lane_t *>memory
            memset(lane, 0, sizeof(lane_t))
            lane.s = &(<Schedule>schedules[j]).s
            lane.pool = self.pool
            lane.index = j
            lane.status = STATUS_DONE
            self.pool.lanes[j] = lane
            self.pool.count = j + 1
            if j > 0:
                if pthread_create(&lane.thread, NULL, _worker, lane) != 0:
                    self.close()
                    raise OSError("could not start a lane thread")
                self.pool.threads = j

    def start(self, int kind, int lanes, uint64_t desc, uintptr_t addr, uintptr_t out, Py_ssize_t count,
              Py_ssize_t itemsize, Py_ssize_t align, Py_ssize_t block_stride, Py_ssize_t out_stride,
              uintptr_t blocks, uintptr_t kernel, int64_t op, double scale, int root):
        """Run one collective over its first ``lanes`` lanes: lane j takes the j-th of ``lanes`` stretches of
        [0, ``count``) items, each starting at a multiple of ``align`` items. Returns True once every lane has
        ended; False when a wait outlasted a slice (``advance`` goes on)."""
        cdef int ended
        if not 1 <= lanes <= self.count:
            raise ValueError(f"{lanes} lanes of a pool of {self.count}")
        with nogil:
            ended = pool_start(self.pool, kind, lanes, desc, addr, out, count, itemsize, align, block_stride,
                               out_stride, blocks, <kernel_t>kernel, op, scale, root)
        return ended > 0

    def starter(self):
        """(``pool_start``'s address, this pool's): what the compiled front needs to start a collective over
        the lanes without Python (``shmcoll.lanes.Lanes.starter``); valid until ``close``."""
        return <uintptr_t>&pool_start, <uintptr_t>self.pool

    def advance(self):
        """The collective in progress one slice further: True once every lane has ended."""
        cdef pool_t *pool = self.pool
        cdef int done
        with nogil:
            done = _resume_caller(pool) and _join(pool, 0, pool.lanes[0].s.slice_ns)
        return done == 1

    def cancel(self):
        """Stop every lane of the collective in progress (each within a slice) and wait until they have."""
        cdef pool_t *pool = self.pool
        arch.shmcoll_store_seq_cst_u32(&pool.cancel, 1)
        if not _final(pool.lanes[0].status):
            _store_status(pool.lanes[0], STATUS_CANCELLED)
        with nogil:
            while not _join(pool, 0, pool.lanes[0].s.slice_ns):
                pass

    def lane(self, int j):
        """(status, step it waits for, step before its first) of lane ``j`` of the collective in progress."""
        cdef lane_t *lane = self.pool.lanes[j]
        return _load_status(lane), arch.shmcoll_load_acquire_u32(&lane.waiting), lane.base

    def runner(self):
        """(``pool_for``'s address, this pool's): what single copy needs to split its local work over the
        lanes (``_single_copy.SingleCopy.set_lanes``); valid until ``close``."""
        return <uintptr_t>&pool_for, <uintptr_t>self.pool

    def close(self):
        """Stop the workers (each after its current job) and free the pool; safe twice."""
        cdef pool_t *pool = self.pool
        cdef int j
        cdef lane_t *lane
        if pool == NULL:
            return
        if pool.creator == getpid():  # a forked child has the memory but not the threads
            arch.shmcoll_store_seq_cst_u32(&pool.cancel, 1)
            arch.shmcoll_store_seq_cst_u32(&pool.stop, 1)
            with nogil:
                for j in range(1, pool.threads + 1):
                    lane = pool.lanes[j]
                    arch.shmcoll_fetch_add_u32(&lane.go, 1)
                    arch.shmcoll_futex_wake_all(&lane.go)
                for j in range(1, pool.threads + 1):
                    pthread_join(pool.lanes[j].thread, NULL)
        self._free()

    cdef void _free(self):
        cdef int j
        if self.pool == NULL:
            return
        for j in range(self.pool.count):
            free(self.pool.lanes[j])
        free(self.pool)
        self.pool = NULL

    def __dealloc__(self):
        self.close()
