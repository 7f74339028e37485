# The collectives' whole path inside a node in one compiled call, from the group's method to the C schedule.
# Textually included by front.pyx (the schedules it calls with the GIL released are schedules.pyx's).
#
# An 8-byte all-reduce exchanges its data in under a microsecond, and the Python layers in front of the same
# schedule (the surface's fast path, the inline run's bookkeeping, the placement, the algorithm, the arena's
# steps) took about four more (bench/bench_floor.py, "shm's own work"), and 6-10 at 1 MiB on the 2-core VM
# (BENCHMARKS.md, "Issue 58 without the device"), more where they split a message over the lanes (a Python
# call per lane to see how it ended). Here one call does what those layers do for the
# calls they would run inline on the copy path, on the caller's thread or over the lanes (the pool started in
# C), and hands every other call back (None) to them. What it may take is decided by the layers it stands for:
# the plan the general path admitted (``Collectives._admit``), the sizes the placement runs that way and how
# (``OneNode.compiled_bytes``, ``allreduce_route``, ``Lanes.for_bytes``), the engine's ``Backlog``, the arena's
# steps; it reads them, it does not decide them again. What it reads of torch's
# objects is most of what it costs: the options' fields it loads from their C++ structs (options.pxi), the
# tensor's through its getters.
#
# An asynchronous call runs here only as far as it goes without waiting for a peer: its first schedule call
# waits no longer than the caller's spin budget, and whatever is left is queued for the progress thread
# (``finish_later``), so a program that issues it and then a call its peers make first does not hang. One that
# would split over the lanes is the general path's (its lanes would run on while the caller goes on).


cdef enum:
    _OPS = 16  # more than the values of c10d's ReduceOp.RedOpType
    # What a call of each collective is keyed by in ``entries``; the order of the kinds, limits and options
    # that SmallCollectives is made with.
    _ALLREDUCE = 0
    _BROADCAST = 1
    _ALLGATHER = 2
    _REDUCE_SCATTER = 3
    _REDUCE = 4
    _ALLTOALL = 5
    _GATHER = 6
    _SCATTER = 7
    _KINDS = 8
    _BARRIER = 8  # where the barrier's options keep asyncOp (``async_at``), after the collectives above


cdef struct _RootedCall:
    # What a gather's or a scatter's preamble found (``SmallCollectives._rooted``).
    Py_ssize_t count, nbytes
    int64_t root
    bint async_op, at_root
    uint64_t desc


cdef class _Resume:
    """``call(base, resume)`` for ``finish_run``: ``method(base, *args, resume)``, one of the Schedule's. Made only
    where a call needs the slow rest (a closure in each method would be made on every call)."""

    cdef object method
    cdef tuple args

    def __cinit__(self, method, tuple args):
        self.method = method
        self.args = args

    def __call__(self, base, resume):
        return self.method(base, *self.args, resume)


cdef class _Deferred:
    """``function(*args)`` when called with no arguments: an all_to_all's ``sizes_error`` for ``finish_run``, made
    only where a call needs the slow rest."""

    cdef object function
    cdef tuple args

    def __cinit__(self, function, tuple args):
        self.function = function
        self.args = args

    def __call__(self):
        return self.function(*self.args)


cdef class SmallCollectives:
    """The group's all_reduce, broadcast, all_gather (into one tensor, or the list form), reduce_scatter_tensor,
    reduce, gather, scatter and all_to_all (both forms) run here, where a call is plain contiguous CPU tensors of a
    plan admitted before, of a size the placement runs on the copy path (``compiled_bytes``), synchronous, or
    asynchronous of at most ``async_try_bytes`` and on one lane, with nothing queued, no profiler, no DEBUG log and
    no earlier error; else None.

    It keeps the group's bookkeeping as ``Collectives._run`` does (its ``GroupState``). A wait that outlasts its
    slice, or a peer in another collective, goes to the Python functions that settle it the slow way
    (``finish_one_shot``, ``finish_run``, ``finish_barrier``): here for a synchronous call, on the progress
    thread for an asynchronous one (``finish_later``), whose first schedule call waits only as long as the
    caller's spin budget. A call over the lanes whose lanes did not all end DONE within the first slice goes
    to ``Lanes.finish``.

    Made with keywords only, each named as the group's objects it stands for."""

    cdef object plans, finish_one_shot, finish_run, finish_barrier, finish_later, alltoall_sizes_error
    cdef GroupState state  # the group's
    cdef Backlog backlog  # the group's progress engine's: a call runs here only with nothing before it
    cdef DebugSwitch debug  # where DEBUG is on, the general path logs each collective
    cdef StepCount steps  # the arena's Steps: step (last posted) and all_reached
    cdef object tensor_type, strided, failed, profiling, barrier_options
    cdef object completed_type, shared_completed, wrappers
    cdef uint64_t barrier_desc
    cdef tuple kinds, options  # per collective (the order above): its descriptor kind, its options' type
    cdef Py_ssize_t limits[_KINDS]  # per collective: the most bytes per rank (reduce-scatter: per block)
    # Where each collective's options keep their fields (``shmcoll.option_fields``; -1: read by the getter)
    cdef Py_ssize_t op_at[_KINDS]
    cdef Py_ssize_t async_at[_KINDS + 1]
    cdef Py_ssize_t root_at[_KINDS]
    cdef list entries  # per collective: key(dtype, op or root) -> what its calls need (``_entry``)
    cdef Schedule schedule
    cdef int count_shift, size, keys_per_dtype
    cdef Py_ssize_t async_try_bytes
    cdef Py_ssize_t one_step_bytes  # the all-reduces of one one-shot step on this thread; above, allreduce_route
    cdef object allreduce_route  # nbytes -> (schedule kind, lanes) (``OneNode.allreduce_route``)
    cdef object lanes  # the arena's ``shmcoll.lanes.Lanes``
    cdef Py_ssize_t split_bytes, align_bytes  # its ``split_bytes``, and where its stretches start
    cdef pool_start_t pool_start  # its pool, once started (``Lanes.starter``)
    cdef void *pool
    # The list forms of all_gather, gather and scatter: their list's addresses, one per rank (``_walk``)
    cdef uintptr_t *blocks
    # all_to_all, either form: (address, bytes) of each rank's block of the input, then of the output (alltoall.pxi);
    # the arena's size tables of each buffer, a row per rank; what the schedule agreed from the first step
    cdef uint64_t *transfers
    cdef uintptr_t tables[2]
    cdef Py_ssize_t table_stride
    cdef int64_t agreed[2]
    cdef readonly Py_ssize_t taken  # calls this path ran (tests check which path ran)

    def __init__(self, *, GroupState state, Backlog backlog, DebugSwitch debug, steps, Schedule schedule,
                 dict plans, tuple kinds, tuple options, tuple limits, int count_shift, Py_ssize_t async_try_bytes,
                 Py_ssize_t one_step_bytes, allreduce_route, lanes, Py_ssize_t align_bytes,
                 finish_one_shot, finish_run, finish_barrier, finish_later, tensor_type, strided, failed,
                 profiling, barrier_options, uint64_t barrier_desc, option_offsets, completed_type,
                 shared_completed, wrappers, tuple size_tables, alltoall_sizes_error):
        self.blocks = <uintptr_t *>malloc(schedule.s.size * sizeof(uintptr_t))
        self.transfers = <uint64_t *>malloc(4 * schedule.s.size * sizeof(uint64_t))
        if self.blocks == NULL or self.transfers == NULL:
            raise MemoryError()
        self.state = state
        self.backlog = backlog
        self.debug = debug
        self.steps = steps
        self.schedule = schedule  # steps.schedule
        self.size = schedule.s.size
        self.plans = plans  # the group's fast plans, by (kind, dtype, op value or root)
        self.kinds = kinds
        self.options = options
        for i in range(_KINDS):
            self.limits[i] = limits[i]
        # option_offsets(options type) -> {field: offset} (``shmcoll.option_fields.offsets``), for each
        # collective's options type and then the barrier's
        for i, options_type in enumerate(options + (barrier_options,)):
            at = option_offsets(options_type)
            self.async_at[i] = at["asyncOp"]
            if i < _KINDS:
                self.op_at[i] = at.get("reduceOp", -1)
                self.root_at[i] = at.get("rootRank", -1)
        self.entries = [{} for _ in range(_KINDS)]
        self.keys_per_dtype = _OPS * self.size  # op values, roots, or (a reduce's) op value x size + root
        self.count_shift = count_shift
        self.async_try_bytes = async_try_bytes
        self.one_step_bytes = one_step_bytes
        self.allreduce_route = allreduce_route
        self.lanes = lanes
        self.split_bytes = lanes.split_bytes
        self.align_bytes = align_bytes
        self.finish_one_shot = finish_one_shot
        self.finish_run = finish_run
        self.finish_barrier = finish_barrier
        self.finish_later = finish_later  # (desc, finish, args, result, inputs) -> the Work of the rest, queued
        # Where the arena's size tables of buffers 0 and 1 are (int64 words, a row of ``table_stride`` bytes per
        # local rank), and the error of an all_to_all whose tables disagree (``alltoall.sizes_error(arena, buffer)``)
        self.tables[0], self.tables[1], self.table_stride = size_tables
        self.alltoall_sizes_error = alltoall_sizes_error
        self.tensor_type = tensor_type
        self.strided = strided
        self.failed = failed  # (error): what a call that raised tells the group (``Collectives._failed``)
        self.profiling = profiling  # whether a profiler is on: the general path records the event
        self.barrier_options = barrier_options  # the barrier's options type and its (only) descriptor
        self.barrier_desc = barrier_desc
        # The Works handed out (``ProgressEngine.completed``): one of its own per call (``completed_type``), but
        # the shared one, holding nothing, to torch's wrappers (the module ``wrappers`` are the globals of).
        self.completed_type = completed_type
        self.shared_completed = shared_completed
        self.wrappers = wrappers

    def __dealloc__(self):
        free(self.blocks)
        free(self.transfers)

    # -- what every call checks ------------------------------------------------

    cdef inline bint _plain(self, tensor):
        """A dense contiguous CPU ``torch.Tensor`` (no subclass: one may override what the checks rely on) whose
        memory holds the values torch shows: not a lazily negated view (``staging.shows_other_values``; the
        general path reads and writes those through stand-ins; a conjugated one is complex, which ``_entry``
        leaves to it too)."""
        return (type(tensor) is self.tensor_type and tensor.is_cpu and tensor.layout is self.strided
                and tensor.is_contiguous() and not tensor.is_neg())

    cdef object _one_tensor(self, int which, tensors, opts):
        """The tensor of a call of collective ``which`` on one plain tensor (all_reduce, broadcast, reduce, a
        gather's input, a scatter's output) as torch passes it, in a list of its own with its options; else
        None."""
        if type(opts) is not self.options[which] or type(tensors) is not list or len(<list>tensors) != 1:
            return None
        tensor = (<list>tensors)[0]
        return tensor if self._plain(tensor) else None

    cdef inline bint _takes(self, tuple entry, Py_ssize_t count, Py_ssize_t nbytes, bint async_op):
        """Whether a call of ``count`` elements (per rank, or per block) of the plan ``entry`` is this path's:
        within the size the placement runs on the copy path (``compiled_bytes``) and, asynchronous, putting in
        (``nbytes``, per rank) at most ``async_try_bytes``: above it the progress thread takes the call, whose
        overlap with the caller pays for the hand-off (``OneNode.async_try_bytes``)."""
        return 0 < count <= <Py_ssize_t>entry[1] and not (async_op and nbytes > self.async_try_bytes)

    cdef Py_ssize_t _op_value(self, int which, opts) except? -1:
        """The value of the call's ReduceOp (its ``RedOpType``; ``hash`` gives it, ``Collectives._admit``)."""
        cdef Py_ssize_t at = self.op_at[which]
        if at >= 0:
            return _field(_options_value(opts), at, 1)
        return hash(opts.reduceOp)

    cdef bint _async_op(self, int which, opts) except -1:
        cdef Py_ssize_t at = self.async_at[which]
        if at >= 0:
            return _field(_options_value(opts), at, 1) != 0
        return opts.asyncOp

    cdef int64_t _root(self, int which, opts) except? -1:
        """A broadcast's or a reduce's root rank."""
        cdef Py_ssize_t at = self.root_at[which]
        if at >= 0:
            return _field(_options_value(opts), at, 8)
        return opts.rootRank

    cdef tuple _entry(self, int which, dtype, Py_ssize_t key_value):
        """What a call of collective ``which`` on ``dtype`` (with op value, root, or for a reduce op value x size
        + root, ``key_value``) needs, from
        its admitted plan: (descriptor less its count, most elements, itemsize, kernel, op, scale); None if
        no plan is admitted. Keyed by one int, no tuple made: dtypes are singletons."""
        if key_value < 0 or key_value >= self.keys_per_dtype:
            return None
        key = <Py_ssize_t><void *>dtype * self.keys_per_dtype + key_value
        entries = <dict>self.entries[which]
        entry = entries.get(key)
        if entry is not None:
            return entry
        plan = self.plans.get((self.kinds[which], dtype, key_value))
        if plan is None:
            return None
        desc_base, red, _ = plan
        itemsize = dtype.itemsize
        # Complex tensors go the general way: a conjugated view (the conj bit) holds other values than torch shows,
        # and asking every call's tensor (is_conj) would cost the other dtypes' calls.
        most = 0 if dtype.is_complex else self.limits[which] // itemsize
        if red is None:
            entry = (desc_base, most, itemsize, 0, 0, 1.0)
        else:
            entry = (desc_base, most, itemsize, red.kernel, red.op.kernel, red.scale)
        entries[key] = entry
        return entry

    cdef bint _may_start(self):
        """Whether a call may run here now: nothing queued or running, no profiler, no DEBUG log, no error,
        and the arena's next step free to write (``Steps.begin_write`` would not wait, or not for longer than a
        first slice: ``_all_reached_last``)."""
        if not self.backlog.idle() or self.profiling() or self.debug.on():
            return False
        # From here to in_collective (``_start``), nothing lets another thread run: a shutdown on one sets
        # the error before it waits for in_collective to clear and unmaps the arena (Collectives.shutdown).
        return self.state.error is None and self._all_reached_last()

    cdef bint _all_reached_last(self):
        """Whether every local rank has reached the last step this one posted, waited for no longer than an
        asynchronous call's first slice (``_short_wait_ns``: the spin budget, and the yields where ranks share
        cores), with the GIL held (see ``_may_start``) and without the futex. A rank that leaves a collective
        before its peers (a reduce's or a gather's other ranks, a scatter's root) mostly finds them there within
        that at its next call, which the general path would wait for the same way, ten microseconds of Python
        later. A collective over the lanes posts one step of the arena's own and no more, so after it the step is
        known reached only once the peers are seen to have posted it too."""
        cdef StepCount steps = self.steps
        cdef sched_t *s = &self.schedule.s
        if steps.all_reached >= steps.step:
            return True
        if _wait_ranks(s.lines, 0, self.size, s.me, <uint32_t>steps.step, s.spin_ns, s.yield_ns, self._short_wait_ns(),
                       s.yield_company) >= 0:
            return False
        steps.all_reached = steps.step
        return True

    cdef void _start(self, uint64_t desc) noexcept:
        self.taken += 1
        cdef GroupState state = self.state
        state.seq += 1
        state.desc = desc
        state.in_collective = True  # the arena is in use: teardown must not unmap it under us

    cdef inline int64_t _short_wait_ns(self) noexcept:
        """How long a wait runs that must end before it would sleep: the spin budget, and the yield budget too
        where local ranks outnumber the cores (``yield_company``), which hands this core to the peers the call
        waits for (they need one to arrive)."""
        return self.schedule.s.spin_ns + (self.schedule.s.yield_ns if self.schedule.s.yield_company > 0 else 0)

    cdef inline int64_t _begin(self, uint64_t desc, bint async_op) noexcept:
        """``_start`` a call on this thread, and make the schedule's first call of an asynchronous one wait no
        longer than it would before it sleeps (``_short_wait_ns``; the rest is the progress thread's); returns
        the slice to restore after that schedule call.

        The yields count where ranks share cores: a call left to the progress thread there costs its wake-ups
        on crowded cores, 5-15x the synchronous call (4 ranks on 2 cores, docs/benchmark-log.md, "Asynchronous
        means asynchronous"), where the peers mostly arrive within the yields."""
        cdef int64_t slice_ns = self.schedule.s.slice_ns
        if async_op:
            self.schedule.s.slice_ns = self._short_wait_ns()
        self._start(desc)
        return slice_ns

    cdef object _settle(self, finish, tuple args, result, inputs, uint64_t desc, bint async_op):
        """The slow rest of a call whose first schedule call did not finish it: ``finish(*args)`` here (None;
        it raises) for a synchronous call, the Work of it queued for the progress thread for an asynchronous
        one, which keeps ``result`` and ``inputs`` (the call's tensors, which the schedule still reads and
        writes by address) until it is done."""
        if async_op:
            self.state.in_collective = False  # until the engine runs the rest (``Collectives._finish_later``)
            return self.finish_later(desc, finish, args, result, inputs)
        try:
            finish(*args)
        except Exception as error:
            self.failed(error)
            raise
        finally:
            self.state.in_collective = False
        return None

    cdef object _ran(self, Py_ssize_t status, int64_t base, uint64_t desc, _Resume call, result, inputs,
                     bint async_op, sizes_error=None):
        """After the first call of a schedule that started after step ``base``: its record (as
        ``shmcoll.algorithms.schedule.run`` keeps it) where it finished, else ``finish_run`` with ``call``
        (None where it finished) and ``sizes_error`` (an all_to_all's); the call's Work."""
        cdef int64_t reached
        cdef StepCount steps
        if status == STATUS_DONE:  # steps.record_schedule(posted, reached), less its Python call
            steps = self.steps
            steps.step = unwrapped_step(base, self.schedule.s.posted)
            reached = unwrapped_step(base, self.schedule.s.reached)
            if reached > steps.all_reached:
                steps.all_reached = reached
            self.state.in_collective = False
            return self._work(result, async_op)
        later = self._settle(self.finish_run, (self.steps, self.schedule, desc, call, base, status, sizes_error),
                             result, inputs, desc, async_op)
        return later if later is not None else self._work(result, async_op)

    cdef object _work(self, result, bint async_op):
        """The Work of a call that finished here (``ProgressEngine.completed``'s rule, for a synchronous one)."""
        if not async_op and called_from(self.wrappers):
            return self.shared_completed
        return self.completed_type(result)

    cdef object _on_lanes(self, int kind, int lanes, uint64_t desc, uintptr_t addr, uintptr_t out,
                          Py_ssize_t count, Py_ssize_t itemsize, Py_ssize_t block_stride, Py_ssize_t out_stride,
                          uintptr_t blocks, uintptr_t kernel, int64_t op, double scale, int root, result, inputs):
        """A synchronous call over ``lanes`` (>= 2) lanes as ``Lanes.run`` makes it: a step of the arena's own
        posted with its descriptor (it writes no buffer), then the pool started in C; lanes that did not all
        end DONE within the first slice go to ``Lanes.finish``, which settles them or raises."""
        cdef int ended
        cdef int64_t fence = self.steps.step + 1
        cdef Py_ssize_t align = max(1, self.align_bytes // itemsize)
        if self.pool == NULL:
            start, pool = self.lanes.starter()
            self.pool_start = <pool_start_t><uintptr_t>start
            self.pool = <void *><uintptr_t>pool
        self._start(desc)
        _post(self.schedule.s.lines, self.schedule.s.me, <uint32_t>fence, desc)  # arena.post, less its Python call
        self.steps.step = fence
        with nogil:
            ended = self.pool_start(self.pool, kind, lanes, desc, addr, out, count, itemsize, align, block_stride,
                                    out_stride, blocks, <kernel_t>kernel, op, scale, root)
        if ended == 2:
            self.state.in_collective = False
        else:
            self._settle(self.lanes.finish, (lanes, fence, desc), result, inputs, desc, False)
        return self._work(result, False)

    # -- the collectives ---------------------------------------------------------

    def allreduce(self, tensors, opts):
        """``group.allreduce(tensors, opts)``: as one one-shot step on this thread up to ``one_step_bytes``, by its
        route above (``allreduce_route``: one-shot steps or chunked on this thread, or over the lanes); or None."""
        tensor = self._one_tensor(_ALLREDUCE, tensors, opts)
        if tensor is None:
            return None
        entry = self._entry(_ALLREDUCE, tensor.dtype, self._op_value(_ALLREDUCE, opts))
        if entry is None:
            return None
        cdef Py_ssize_t count = tensor.numel(), itemsize = entry[2], nbytes = count * itemsize
        cdef bint async_op = self._async_op(_ALLREDUCE, opts)
        if not self._takes(entry, count, nbytes, async_op) or not self._may_start():
            return None
        cdef uint64_t desc = <uint64_t>entry[0] | (<uint64_t>count) << self.count_shift
        cdef uintptr_t addr = tensor.data_ptr()
        cdef kernel_t kernel = <kernel_t><uintptr_t>entry[3]
        cdef int64_t op = entry[4]
        cdef double scale = entry[5]
        if nbytes > self.one_step_bytes:
            return self._allreduce_routed(tensors, nbytes, async_op, desc, addr, count, entry, op, scale)
        cdef int64_t step = self.steps.step + 1
        cdef Py_ssize_t status
        cdef int64_t slice_ns = self._begin(desc, async_op)
        with nogil:
            status = one_shot(&self.schedule.s, <uint32_t>step, desc, <char *>addr, count, <int>itemsize, kernel,
                              op, scale, False)
        self.schedule.s.slice_ns = slice_ns
        if status == STATUS_DONE:  # steps.record_schedule(step, step), less its Python call
            self.steps.step = step
            self.steps.all_reached = step
            self.state.in_collective = False
            return self._work(tensors, async_op)
        later = self._settle(self.finish_one_shot, (self.steps, step, status, desc, addr, count, itemsize, entry[3],
                                                    op, scale), tensors, tensors, desc, async_op)
        return later if later is not None else self._work(tensors, async_op)

    cdef object _allreduce_routed(self, tensors, Py_ssize_t nbytes, bint async_op, uint64_t desc, uintptr_t addr,
                                  Py_ssize_t count, tuple entry, int64_t op, double scale):
        """An all-reduce above the one-step limit, by its route."""
        kind, lanes = self.allreduce_route(nbytes)
        cdef Py_ssize_t itemsize = entry[2]
        if lanes > 1:
            return None if async_op else self._on_lanes(kind, lanes, desc, addr, 0, count, itemsize, 0, 0, 0,
                                                        entry[3], op, scale, -1, tensors, tensors)
        if kind != KIND_ONE_SHOT_STEPS and kind != KIND_CHUNKED:
            return None  # one step on one lane: below one_step_bytes, never here
        cdef int64_t base = self.steps.step
        cdef kernel_t kernel = <kernel_t><uintptr_t>entry[3]
        cdef Py_ssize_t status
        cdef bint steps = kind == KIND_ONE_SHOT_STEPS
        cdef int64_t slice_ns = self._begin(desc, async_op)
        with nogil:
            if steps:
                status = one_shot_steps(&self.schedule.s, <uint32_t>base, desc, <char *>addr, count, <int>itemsize,
                                        kernel, op, scale, -1)
            else:
                status = chunked(&self.schedule.s, <uint32_t>base, desc, <char *>addr, count, <int>itemsize, kernel,
                                 op, scale, -1, -1)
        self.schedule.s.slice_ns = slice_ns
        if status == STATUS_DONE:
            return self._ran(status, base, desc, None, tensors, tensors, async_op)
        resume = (_Resume(self.schedule.one_shot_steps, (desc, addr, count, itemsize, entry[3], op, scale)) if steps
                  else _Resume(self.schedule.chunked, (desc, addr, count, itemsize, entry[3], op, scale, -1)))
        return self._ran(status, base, desc, resume, tensors, tensors, async_op)

    def barrier(self, opts):
        """``group.barrier(opts)`` as one step, or None."""
        if type(opts) is not self.barrier_options or not self._may_start():
            return None
        cdef bint async_op = self._async_op(_BARRIER, opts)
        cdef int64_t step = self.steps.step + 1
        cdef uint64_t desc = self.barrier_desc
        cdef Py_ssize_t status
        cdef int64_t slice_ns = self._begin(desc, async_op)
        with nogil:
            status = barrier(&self.schedule.s, <uint32_t>step, desc)
        self.schedule.s.slice_ns = slice_ns
        self.steps.step = step  # posted (steps.record_schedule, less its Python call)
        if status == STATUS_DONE:
            self.steps.all_reached = step
            self.state.in_collective = False
            return self._work([], async_op)
        later = self._settle(self.finish_barrier, (self.steps, step, desc), [], [], desc, async_op)
        return later if later is not None else self._work([], async_op)

    def reduce(self, tensors, opts):
        """``group.reduce(tensors, opts)`` on the copy path: the chunked schedule with a root (which alone gathers
        the shares), on this thread or over the lanes; or None."""
        tensor = self._one_tensor(_REDUCE, tensors, opts)
        if tensor is None:
            return None
        cdef int64_t root = self._root(_REDUCE, opts)
        cdef Py_ssize_t op_value = self._op_value(_REDUCE, opts)
        if not (0 <= root < self.size and 0 <= op_value < _OPS):  # else another (op, root)'s key
            return None
        entry = self._entry(_REDUCE, tensor.dtype, op_value * self.size + root)
        if entry is None:
            return None
        cdef Py_ssize_t count = tensor.numel(), itemsize = entry[2], nbytes = count * itemsize
        cdef bint async_op = self._async_op(_REDUCE, opts)
        if not self._takes(entry, count, nbytes, async_op) or not self._may_start():
            return None
        cdef uint64_t desc = <uint64_t>entry[0] | (<uint64_t>count) << self.count_shift
        cdef uintptr_t addr = tensor.data_ptr(), kernel = entry[3]
        cdef int64_t op = entry[4]
        cdef double scale = entry[5]
        if nbytes >= self.split_bytes:
            return None if async_op else self._on_lanes(KIND_CHUNKED, self.lanes.for_bytes(nbytes), desc, addr, 0,
                                                        count, itemsize, 0, 0, 0, kernel, op, scale, <int>root,
                                                        tensors, tensors)
        cdef int64_t base = self.steps.step
        cdef Py_ssize_t status
        cdef int64_t slice_ns = self._begin(desc, async_op)
        with nogil:
            status = chunked(&self.schedule.s, <uint32_t>base, desc, <char *>addr, count, <int>itemsize,
                             <kernel_t>kernel, op, scale, <int>root, -1)
        self.schedule.s.slice_ns = slice_ns
        return self._ran(status, base, desc, None if status == STATUS_DONE else
                         _Resume(self.schedule.chunked, (desc, addr, count, itemsize, kernel, op, scale, root)),
                         tensors, tensors, async_op)

    def broadcast(self, tensors, opts):
        """``group.broadcast(tensors, opts)`` on the copy path, on this thread or over the lanes; or None."""
        tensor = self._one_tensor(_BROADCAST, tensors, opts)
        if tensor is None:
            return None
        cdef int64_t root = self._root(_BROADCAST, opts)  # a root out of the group's range has no entry
        entry = self._entry(_BROADCAST, tensor.dtype, root)
        if entry is None:
            return None
        cdef Py_ssize_t count = tensor.numel(), nbytes = count * <Py_ssize_t>entry[2]
        cdef bint async_op = self._async_op(_BROADCAST, opts)
        if not self._takes(entry, count, nbytes, async_op) or not self._may_start():
            return None
        cdef int64_t base = self.steps.step
        cdef uint64_t desc = <uint64_t>entry[0] | (<uint64_t>count) << self.count_shift
        cdef uintptr_t addr = tensor.data_ptr()
        if nbytes >= self.split_bytes:
            return None if async_op else self._on_lanes(KIND_BROADCAST, self.lanes.for_bytes(nbytes), desc, addr, 0,
                                                        nbytes, 1, 0, 0, 0, 0, 0, 1.0, <int>root, tensors, tensors)
        cdef Py_ssize_t status
        cdef int64_t slice_ns = self._begin(desc, async_op)
        with nogil:
            status = broadcast(&self.schedule.s, <uint32_t>base, desc, <char *>addr, nbytes, <int>root, -1)
        self.schedule.s.slice_ns = slice_ns
        return self._ran(status, base, desc, None if status == STATUS_DONE else
                         _Resume(self.schedule.broadcast, (desc, addr, nbytes, root)), tensors, tensors, async_op)

    def allgather_into(self, output, input, opts):
        """``group.all_gather_single(output, input, opts)`` on the copy path, on this thread or over the lanes; or
        None."""
        if type(opts) is not self.options[_ALLGATHER] or not self._plain(input) or not self._plain(output):
            return None
        dtype = input.dtype
        if output.dtype is not dtype:
            return None
        entry = self._entry(_ALLGATHER, dtype, 0)
        if entry is None:
            return None
        cdef Py_ssize_t count = input.numel()
        cdef bint async_op = self._async_op(_ALLGATHER, opts)
        if (not self._gathers(entry, count, async_op) or output.numel() != count * self.size
                or not self._may_start()):
            return None
        return self._allgather(entry, count, async_op, input.data_ptr(), output.data_ptr(), False, [output], [input])

    def allgather(self, output_lists, input_tensors, opts):
        """``group.allgather([outputs], [input], opts)``, the list form (one output tensor per rank), as
        ``allgather_into`` runs the other; or None."""
        if (type(opts) is not self.options[_ALLGATHER] or type(input_tensors) is not list or len(input_tensors) != 1
                or type(output_lists) is not list or len(output_lists) != 1):
            return None
        input, outputs = input_tensors[0], output_lists[0]
        if not self._plain(input):
            return None
        dtype = input.dtype
        entry = self._entry(_ALLGATHER, dtype, 0)
        if entry is None:
            return None
        cdef Py_ssize_t count = input.numel()
        cdef bint async_op = self._async_op(_ALLGATHER, opts)
        if not self._gathers(entry, count, async_op):
            return None
        if self._walk(outputs, dtype, count, 0, NULL) < 0 or not self._may_start():
            return None
        return self._allgather(entry, count, async_op, input.data_ptr(), 0, True, output_lists, [input])

    cdef Py_ssize_t _walk(self, tensors, dtype, Py_ssize_t count, Py_ssize_t itemsize, uint64_t *pairs) except -2:
        """Where ``tensors`` is a list of one plain tensor of ``dtype`` per rank, each of ``count`` elements
        where ``count`` >= 0 (the list forms: all_gather's outputs, a gather's root's, a scatter's root's
        inputs; all_to_all's of any sizes): their elements in all, and each one's address into ``blocks``, or
        with ``pairs``, its (address, bytes of ``itemsize``) there; else -1."""
        if type(tensors) is not list or len(<list>tensors) != self.size:
            return -1
        cdef Py_ssize_t n, total = 0
        cdef int r
        for r in range(self.size):
            tensor = (<list>tensors)[r]
            if not self._plain(tensor) or tensor.dtype is not dtype:
                return -1
            n = tensor.numel()
            if count >= 0 and n != count:
                return -1
            if pairs == NULL:
                self.blocks[r] = tensor.data_ptr()
            else:
                pairs[2 * r] = tensor.data_ptr()
                pairs[2 * r + 1] = n * itemsize
            total += n
        return total

    cdef inline bint _gathers(self, tuple entry, Py_ssize_t count, bint async_op):
        """Whether an all-gather, a gather or a scatter of ``count`` elements per rank is this path's."""
        return self._takes(entry, count, count * <Py_ssize_t>entry[2], async_op)

    cdef object _allgather(self, tuple entry, Py_ssize_t count, bint async_op, uintptr_t addr, uintptr_t out,
                           bint listed, result, inputs):
        """An all-gather into one output at ``out``, or (``listed``) into those whose addresses are in
        ``blocks``."""
        cdef Py_ssize_t nbytes = count * <Py_ssize_t>entry[2]
        cdef const uintptr_t *blocks = self.blocks if listed else NULL
        cdef int64_t base = self.steps.step
        cdef uint64_t desc = <uint64_t>entry[0] | (<uint64_t>count) << self.count_shift
        if nbytes >= self.split_bytes:
            return None if async_op else self._on_lanes(KIND_ALLGATHER, self.lanes.for_bytes(nbytes), desc, addr, out,
                                                        nbytes, 1, 0, nbytes, <uintptr_t>blocks, 0, 0, 1.0, -1,
                                                        result, inputs)
        cdef Py_ssize_t status
        cdef int64_t slice_ns = self._begin(desc, async_op)
        with nogil:
            status = allgather(&self.schedule.s, <uint32_t>base, desc, <char *>addr, nbytes, <char *>out, nbytes,
                               blocks, -1)
        self.schedule.s.slice_ns = slice_ns
        if status == STATUS_DONE:
            rest = None
        elif listed:
            rest = _Resume(self._listed_rest, (desc, addr, nbytes, self._kept_blocks(True)))
        else:
            rest = _Resume(self.schedule.allgather, (desc, addr, nbytes, out, nbytes, 0))
        return self._ran(status, base, desc, rest, result, inputs, async_op)

    def _listed_rest(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, bytes table,
                     Py_ssize_t resume):
        """A schedule call of the rest of a list-form all_gather whose outputs' addresses ``table`` keeps
        (``_kept_blocks``)."""
        return self.schedule.allgather(base, desc, addr, nbytes, 0, nbytes, <uintptr_t><const char *>table, resume)

    def reduce_scatter(self, output, input, opts):
        """``group.reduce_scatter_single(output, input, opts)`` on the copy path, on this thread or over the lanes;
        or None."""
        if type(opts) is not self.options[_REDUCE_SCATTER] or not self._plain(input) or not self._plain(output):
            return None
        dtype = output.dtype
        if input.dtype is not dtype:
            return None
        entry = self._entry(_REDUCE_SCATTER, dtype, self._op_value(_REDUCE_SCATTER, opts))
        if entry is None:
            return None
        cdef Py_ssize_t count = output.numel(), itemsize = entry[2]
        cdef bint async_op = self._async_op(_REDUCE_SCATTER, opts)
        if (not self._takes(entry, count, count * itemsize * self.size, async_op)
                or input.numel() != count * self.size or not self._may_start()):
            return None
        cdef int64_t base = self.steps.step
        cdef uint64_t desc = <uint64_t>entry[0] | (<uint64_t>count) << self.count_shift
        cdef uintptr_t addr = input.data_ptr(), out = output.data_ptr()
        cdef uintptr_t kernel = entry[3]
        cdef int64_t op = entry[4]
        cdef double scale = entry[5]
        if count * itemsize >= self.split_bytes:
            return None if async_op else self._on_lanes(KIND_REDUCE_SCATTER, self.lanes.for_bytes(count * itemsize),
                                                        desc, addr, out, count, itemsize, count, 0, 0, kernel, op,
                                                        scale, -1, [output], [input])
        cdef Py_ssize_t status
        cdef int64_t slice_ns = self._begin(desc, async_op)
        with nogil:
            status = reduce_scatter(&self.schedule.s, <uint32_t>base, desc, <char *>addr, count, count, <int>itemsize,
                                    <char *>out, apart(out, addr, count, count, <int>itemsize, self.size),
                                    <kernel_t>kernel, op, scale, -1)
        self.schedule.s.slice_ns = slice_ns
        return self._ran(status, base, desc, None if status == STATUS_DONE else
                         _Resume(self.schedule.reduce_scatter, (desc, addr, count, count, itemsize, out, kernel, op,
                                                                scale)), [output], [input], async_op)

    cdef bint _rooted(self, int which, tensors, lists, opts, _RootedCall *call) except -1:
        """Whether a gather's (``which``: _GATHER) or a scatter's (_SCATTER) call is this path's; its size,
        root, asynchrony and descriptor into ``call``. ``tensors`` is one plain tensor (a gather's
        input, a scatter's output); ``lists`` the root's one list of a tensor per rank (their addresses into
        ``blocks``), the others' empty, as torch passes them."""
        tensor = self._one_tensor(which, tensors, opts)
        if tensor is None or type(lists) is not list:
            return False
        call.root = self._root(which, opts)  # a root out of the group's range has no entry
        dtype = tensor.dtype
        entry = self._entry(which, dtype, call.root)
        if entry is None:
            return False
        call.count = tensor.numel()
        call.async_op = self._async_op(which, opts)
        call.at_root = call.root == self.schedule.s.me
        if (not self._gathers(entry, call.count, call.async_op)
                or not (self._walk((<list>lists)[0], dtype, call.count, 0, NULL) >= 0
                        if call.at_root and len(<list>lists) == 1 else not call.at_root and len(<list>lists) == 0)
                or not self._may_start()):
            return False
        call.nbytes = call.count * <Py_ssize_t>entry[2]
        call.desc = <uint64_t>entry[0] | (<uint64_t>call.count) << self.count_shift
        return True

    def gather(self, output_lists, input_tensors, opts):
        """``group.gather(output_lists, input_tensors, opts)`` on the copy path, on this thread (``_rooted``); or
        None."""
        cdef _RootedCall call
        if not self._rooted(_GATHER, input_tensors, output_lists, opts, &call):
            return None
        input = (<list>input_tensors)[0]
        cdef const uintptr_t *blocks = self.blocks if call.at_root else NULL
        cdef uintptr_t addr = input.data_ptr()
        cdef int64_t base = self.steps.step
        cdef Py_ssize_t status
        cdef int64_t slice_ns = self._begin(call.desc, call.async_op)
        with nogil:
            status = gather(&self.schedule.s, <uint32_t>base, call.desc, <const char *>addr, call.nbytes,
                            <int>call.root, blocks, -1)
        self.schedule.s.slice_ns = slice_ns
        return self._ran(status, base, call.desc, None if status == STATUS_DONE else
                         _Resume(self._gather_rest, (call.desc, addr, call.nbytes, call.root,
                                                     self._kept_blocks(call.at_root))),
                         output_lists, [input], call.async_op)

    def scatter(self, output_tensors, input_lists, opts):
        """``group.scatter(output_tensors, input_lists, opts)`` on the copy path, on this thread (``_rooted``); or
        None."""
        cdef _RootedCall call
        if not self._rooted(_SCATTER, output_tensors, input_lists, opts, &call):
            return None
        cdef const uintptr_t *blocks = self.blocks if call.at_root else NULL
        cdef uintptr_t out = (<list>output_tensors)[0].data_ptr()
        cdef int64_t base = self.steps.step
        cdef Py_ssize_t status
        cdef int64_t slice_ns = self._begin(call.desc, call.async_op)
        with nogil:
            status = scatter(&self.schedule.s, <uint32_t>base, call.desc, blocks, call.nbytes, <int>call.root,
                             <char *>out, -1)
        self.schedule.s.slice_ns = slice_ns
        return self._ran(status, base, call.desc, None if status == STATUS_DONE else
                         _Resume(self._scatter_rest, (call.desc, self._kept_blocks(call.at_root), call.nbytes,
                                                      call.root, out)),
                         output_tensors, input_lists[0] if call.at_root else [], call.async_op)

    cdef bytes _kept_blocks(self, bint listed):
        """The ``blocks`` table as it is now (or nothing), for the rest of a call that reads it after this one
        returns: a later call rewrites ``blocks``."""
        return PyBytes_FromStringAndSize(<char *>self.blocks, self.size * sizeof(uintptr_t)) if listed else b""

    def _gather_rest(self, uint32_t base, uint64_t desc, uintptr_t addr, Py_ssize_t nbytes, int root, bytes table,
                     Py_ssize_t resume):
        """A schedule call of the rest of a gather whose root's outputs' addresses ``table`` keeps."""
        return self.schedule.gather(base, desc, addr, nbytes, root, <uintptr_t><const char *>table, resume)

    def _scatter_rest(self, uint32_t base, uint64_t desc, bytes table, Py_ssize_t nbytes, int root, uintptr_t out,
                      Py_ssize_t resume):
        """A schedule call of the rest of a scatter whose root's inputs' addresses ``table`` keeps."""
        return self.schedule.scatter(base, desc, <uintptr_t><const char *>table, nbytes, root, out, resume)

    def alltoall_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        """``group.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)`` on the copy path, on
        this thread, with each rank's blocks as ``checks.split_bytes`` makes them; or None."""
        if (type(opts) is not self.options[_ALLTOALL] or not self._plain(input) or not self._plain(output)
                or input.dim() == 0 or output.dim() == 0):
            return None
        dtype = input.dtype
        if output.dtype is not dtype:
            return None
        entry = self._entry(_ALLTOALL, dtype, 0)
        if entry is None:
            return None
        cdef Py_ssize_t most = max(input.numel(), output.numel())
        cdef bint async_op = self._async_op(_ALLTOALL, opts)
        if (most > <Py_ssize_t>entry[1] or (async_op and most * <Py_ssize_t>entry[2] > self.async_try_bytes)
                or not self._split(input, input_split_sizes, self.transfers)
                or not self._split(output, output_split_sizes, self.transfers + 2 * self.size)
                or not self._may_start()):
            return None
        return self._alltoall(entry[0], async_op, [output], [input])

    def alltoall(self, output_tensors, input_tensors, opts):
        """``group.alltoall(output_tensors, input_tensors, opts)``, the list form (one tensor per rank each way, of
        any sizes), as ``alltoall_single`` runs the other; or None."""
        if (type(opts) is not self.options[_ALLTOALL] or type(input_tensors) is not list
                or len(<list>input_tensors) != self.size):
            return None
        first = (<list>input_tensors)[0]
        if type(first) is not self.tensor_type:  # its dtype keys the entry; ``_walk`` checks the rest of it
            return None
        dtype = first.dtype
        entry = self._entry(_ALLTOALL, dtype, 0)
        if entry is None:
            return None
        cdef Py_ssize_t itemsize = entry[2]
        cdef Py_ssize_t sent = self._walk(input_tensors, dtype, -1, itemsize, self.transfers)
        cdef Py_ssize_t received = self._walk(output_tensors, dtype, -1, itemsize, self.transfers + 2 * self.size)
        cdef Py_ssize_t most = max(sent, received)
        if sent < 0 or received < 0 or most > <Py_ssize_t>entry[1]:
            return None
        cdef bint async_op = self._async_op(_ALLTOALL, opts)
        if (async_op and most * itemsize > self.async_try_bytes) or not self._may_start():
            return None
        return self._alltoall(entry[0], async_op, output_tensors, input_tensors)

    cdef object _alltoall(self, uint64_t desc, bint async_op, result, inputs):
        """An all_to_all of the blocks in ``transfers`` (what this rank sends to each rank, then what it receives
        from each), either form: its size table's row, then the schedule (an all_to_all's descriptor has no
        count)."""
        cdef int64_t base = self.steps.step
        cdef int buffer = (base + 1) & 1
        # Our row of the size tables, in the buffer of the schedule's first step (size_tables.pxi).
        write_size_row(<int64_t *>(self.tables[buffer] + self.schedule.s.me * self.table_stride), self.size,
                       self.transfers, self.transfers + 2 * self.size, 0)
        cdef Py_ssize_t status
        cdef int64_t slice_ns = self._begin(desc, async_op)
        with nogil:
            status = alltoall(&self.schedule.s, <uint32_t>base, desc, self.transfers, self.transfers + 2 * self.size,
                              <const char *>self.tables[buffer], self.table_stride, self.agreed, -1)
        self.schedule.s.slice_ns = slice_ns
        if status == STATUS_DONE:
            return self._ran(status, base, desc, None, result, inputs, async_op)
        # The rest keeps its own copy of the blocks and of what was agreed (and its Work, of the lists: ``held``).
        transfers = PyBytes_FromStringAndSize(<char *>self.transfers, 4 * self.size * sizeof(uint64_t))
        agreed = bytearray(PyBytes_FromStringAndSize(<char *>self.agreed, 2 * sizeof(int64_t)))
        return self._ran(status, base, desc, _Resume(self._alltoall_rest, (desc, transfers, buffer, agreed)),
                         result, inputs, async_op,
                         _Deferred(self.alltoall_sizes_error, (self.steps, buffer)))

    def _alltoall_rest(self, uint32_t base, uint64_t desc, bytes transfers, int buffer, bytearray agreed,
                       Py_ssize_t resume):
        """A schedule call of the rest of an all_to_all (either form) whose blocks ``transfers`` keeps."""
        cdef const char *blocks = transfers
        cdef char *kept = agreed
        cdef Py_ssize_t status
        with nogil:
            status = alltoall(&self.schedule.s, base, desc, <const uint64_t *>blocks,
                              <const uint64_t *>blocks + 2 * self.size, <const char *>self.tables[buffer],
                              self.table_stride, <int64_t *>kept, resume)
        return status

    cdef bint _split(self, tensor, splits, uint64_t *blocks) except -1:
        """(address, bytes) of each rank's block of ``tensor`` along dim 0 into ``blocks``, as
        ``checks.split_bytes`` makes them from ``splits`` (rows per rank; none: even); False where it would
        raise (the general path says why)."""
        if type(splits) is not list:
            return False
        cdef Py_ssize_t rows = tensor.shape[0], given = len(<list>splits)
        cdef Py_ssize_t row_bytes = tensor.nbytes // rows if rows else 0
        cdef Py_ssize_t n, taken = 0
        cdef uintptr_t addr = tensor.data_ptr()
        cdef int r
        if given == 0 and rows % self.size or given != 0 and given != self.size:
            return False
        for r in range(self.size):
            if given == 0:
                n = rows // self.size
            else:
                split = (<list>splits)[r]
                if type(split) is not int or not 0 <= split <= rows:
                    return False
                n = split
            blocks[2 * r] = addr + taken * row_bytes
            blocks[2 * r + 1] = n * row_bytes
            taken += n
        return taken == rows
