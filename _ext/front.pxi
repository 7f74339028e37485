# The small all-reduce's whole path in one compiled call, from the group's method to one_shot.
# Textually included by schedules.pyx (after allreduce.pxi, whose one_shot it calls with the GIL released).
#
# An 8-byte all-reduce exchanges its data in under a microsecond, and the Python layers in front of the same
# schedule (the surface's fast path, the inline run's bookkeeping, the placement, the arena's steps) took about
# four more (bench/bench_floor.py, "shm's own work"). Here one call does what those layers do for the calls
# they would run inline, one step on one lane, and hands every other call back (None) to them. What it may
# take is decided by the layers it stands for: the plan the general path admitted (``Collectives._admit``),
# the one-step, one-lane limit of the placement (``OneNode.one_lane_one_shot_bytes``), the engine's ``busy``, the arena's
# steps; it reads them, it does not decide them again.


cdef enum:
    _OPS = 16  # more than the values of c10d's ReduceOp.RedOpType
    _DEBUG = 10  # logging.DEBUG


cdef class SmallAllreduce:
    """``group.allreduce(tensors, opts)`` run here, where it is one plain contiguous CPU tensor of a plan
    admitted before, at most one lane's one-shot, inline (synchronous, or asynchronous and at most
    ``inline_async_bytes``), with no profiler, no DEBUG log and no earlier error; else None.

    It keeps the group's bookkeeping as ``Collectives._run`` does (``_seq``, ``_desc``, ``_in_collective``, the
    error that makes the group unusable), and a wait that outlasts its slice, or a peer in another collective,
    goes to ``finish`` (``shmcoll.algorithms.allreduce.finish_one_shot``), which settles it the slow way."""

    cdef object group, engine, steps, plans, finish
    cdef object options_type, tensor_type, strided, error_type, profiling, log
    cdef dict log_cache
    cdef Schedule schedule
    cdef dict entries  # _key(dtype, op value) -> (desc less its count, most elements, itemsize, kernel, op, scale)
    cdef int kind, count_shift
    cdef readonly Py_ssize_t taken  # calls this path ran (tests check which path ran)
    cdef Py_ssize_t most_bytes, inline_async_bytes

    def __init__(self, group, engine, steps, Schedule schedule, dict plans, int kind, int count_shift,
                 Py_ssize_t most_bytes, Py_ssize_t inline_async_bytes, finish, options_type, tensor_type, strided,
                 error_type, profiling, log):
        self.group = group
        self.engine = engine
        self.steps = steps  # the arena's Steps: step (last posted) and all_reached
        self.schedule = schedule  # steps.schedule
        self.plans = plans  # the group's fast plans, by (kind, dtype, op value)
        self.kind = kind
        self.count_shift = count_shift
        self.most_bytes = most_bytes  # the largest all-reduce that is one step on one lane (OneNode)
        self.inline_async_bytes = inline_async_bytes
        self.finish = finish
        self.options_type = options_type
        self.tensor_type = tensor_type
        self.strided = strided
        self.error_type = error_type  # the errors that make the group unusable (ShmcollError)
        self.profiling = profiling  # whether a profiler is on: the general path records the event
        self.log = log  # where DEBUG is on, the general path logs each collective
        # logging's own record of the levels asked about, kept until a level changes: one dict read per call
        # where Logger.isEnabledFor is a Python call
        cached = getattr(log, "_cache", None)
        self.log_cache = cached if type(cached) is dict else None
        self.entries = {}

    cdef bint _debug(self):
        if self.log_cache is not None:
            enabled = self.log_cache.get(_DEBUG)
            if enabled is not None:
                return enabled
        return self.log.isEnabledFor(_DEBUG)

    cdef tuple _entry(self, key, dtype, Py_hash_t op):
        """What a call of ``dtype`` and ``op`` needs, from its admitted plan; None if there is none."""
        plan = self.plans.get((self.kind, dtype, op))
        if plan is None:
            return None
        desc_base, red, _ = plan
        itemsize = dtype.itemsize
        entry = (desc_base, self.most_bytes // itemsize, itemsize, red.kernel, red.op.kernel, red.scale)
        self.entries[key] = entry
        return entry

    def __call__(self, tensors, opts):
        if type(opts) is not self.options_type or type(tensors) is not list or len(<list>tensors) != 1:
            return None
        tensor = (<list>tensors)[0]
        if (type(tensor) is not self.tensor_type or not tensor.is_cpu or tensor.layout is not self.strided
                or not tensor.is_contiguous()):
            return None
        dtype = tensor.dtype
        cdef Py_hash_t op = hash(opts.reduceOp)
        if op < 0 or op >= _OPS:
            return None
        # (dtype, op) as one int, no tuple made: dtypes are singletons, op values below _OPS
        key = <Py_ssize_t><void *>dtype * _OPS + op
        entry = self.entries.get(key)
        if entry is None:
            entry = self._entry(key, dtype, op)
            if entry is None:
                return None
        cdef uint64_t desc_base = entry[0]
        cdef Py_ssize_t most = entry[1], itemsize = entry[2]
        cdef Py_ssize_t count = tensor.numel()
        cdef bint async_op = opts.asyncOp
        if count <= 0 or count > most or (async_op and count * itemsize > self.inline_async_bytes):
            return None
        group, steps = self.group, self.steps
        engine = self.engine
        # engine.busy() read in place: its queue first, then whether it runs (ProgressEngine.busy says why)
        if engine._queue or engine._running or self.profiling() or self._debug():
            return None
        # From here to _in_collective below, nothing lets another thread run: a shutdown on one sets _error
        # before it waits for _in_collective to clear and unmaps the arena (Collectives.shutdown).
        if group._error is not None:
            return None
        cdef int64_t step = steps.step + 1
        if steps.all_reached < step - 1:  # the step's buffer may still be read: the general path waits
            return None
        cdef uint64_t desc = desc_base | (<uint64_t>count) << self.count_shift
        cdef uintptr_t addr = tensor.data_ptr()
        cdef kernel_t kernel = <kernel_t><uintptr_t>entry[3]
        cdef int64_t kernel_op = entry[4]
        cdef double scale = entry[5]
        cdef Py_ssize_t status
        self.taken += 1
        group._seq += 1
        group._desc = desc
        group._in_collective = True  # the arena is in use: teardown must not unmap it under us
        with nogil:
            status = one_shot(&self.schedule.s, <uint32_t>step, desc, <char *>addr, count, <int>itemsize, kernel,
                              kernel_op, scale, False)
        if status == STATUS_DONE:
            steps.step = step
            steps.all_reached = step
            group._in_collective = False
        else:
            try:
                self.finish(steps, step, status, desc, addr, count, itemsize, entry[3], kernel_op, scale)
            except Exception as error:
                if isinstance(error, self.error_type):
                    group._error = error
                if not async_op:
                    raise
                return engine.finished(tensors, desc, error)
            finally:
                group._in_collective = False
        if async_op:
            return engine.finished(tensors, desc)
        done = engine._completed  # engine.completed(tensors), less its Python call (a sixth of this path)
        done._result = tensors
        done._source = -1
        return done
