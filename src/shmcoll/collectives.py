"""The torch.distributed surface of the shm backend: each collective written once.

Every method does three things: check its arguments (``shmcoll.checks``), hand
them to the group's placement (``shmcoll.placement``: one rank, one node's
arena, or several nodes), and return a Work. The placement, chosen once when
the group is made, decides where the bytes go; the ProgressEngine runs the
collectives in issue order (inline when synchronous and nothing is queued, on
the progress thread otherwise).

``Collectives`` holds the methods, one per collective; ``ProcessGroupShm``
(``shmcoll.process_group``), a Python ProcessGroup subclass, gives them c10d's call
forms and names (aliases included), keeps them out of TorchDynamo, and is what
the creator returns on every supported torch (docs/DESIGN.md says why not a
Python c10d Backend under a C++ group, which torch 2.14 allows). This module
imports nothing of it.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from shmcoll import (_front, _p2p, _torch_compat, checks, descriptors, gloo_exit, kernel_library, ops,
                     option_fields, placement, profiling, sparse, staging)
from shmcoll._env import read_settings
from shmcoll._state import DebugSwitch, GroupState
from shmcoll._logging import configure as _configure_logging
from shmcoll._logging import log as _log
from shmcoll import lanes as lanes_module
from shmcoll.algorithms import allreduce as allreduce_algorithm
from shmcoll.algorithms import alltoall as alltoall_algorithm
from shmcoll.algorithms import barrier as barrier_algorithm
from shmcoll.algorithms import schedule as schedule_driver
from shmcoll.errors import AbortedError, ShmcollError
from shmcoll.work import CompletedWork, ProgressEngine, WritingBack, ending, held

_STRIDED = torch.strided
_profiling = profiling.active
_SUM = dist.ReduceOp.SUM
_Tensor = torch.Tensor
_AllreduceOptions = dist.AllreduceOptions
_ReduceScatterOptions = dist.ReduceScatterOptions
_BroadcastOptions = dist.BroadcastOptions
_ReduceOptions = dist.ReduceOptions
_AllgatherOptions = _torch_compat.AllgatherOptions
_AllToAllOptions = dist.AllToAllOptions
_GatherOptions = dist.GatherOptions
_ScatterOptions = dist.ScatterOptions
_BarrierOptions = dist.BarrierOptions


def _reduce_op(opts):
    return opts.reduceOp if opts is not None else _SUM


def _is_async(opts) -> bool:
    # Options the caller left out: the c10d default, asynchronous (torch's wrappers always pass them).
    return True if opts is None else opts.asyncOp


def _dense_cpu(tensor) -> bool:
    """A dense CPU ``torch.Tensor`` (no subclass: one may override what the checks rely on): what the fast
    paths take without further checks."""
    return type(tensor) is _Tensor and tensor.is_cpu and tensor.layout is _STRIDED


class _FastPlan(NamedTuple):
    """What a fast path keeps of a call the general path ran (``Collectives._admit``)."""
    desc_base: int  # the descriptor less its count
    red: ops.Reduction | None = None  # a reduction's plan
    one_shot_count: int = 0  # all_reduce: the most elements the placement's one-shot path takes


def _hash_is_op_value() -> bool:
    """Whether ``hash(ReduceOp)`` is the op's value, which the small all-reduce path keys on.

    It is in every torch we support and costs half of ``.op.value``; were it ever
    not, that path would only miss (and the general path run), never pick a wrong op.
    """
    return all(hash(dist.ReduceOp(kind)) == kind.value for kind in dist.ReduceOp.RedOpType.__members__.values()
               if kind != dist.ReduceOp.RedOpType.PREMUL_SUM)


class Collectives:
    """CPU collectives of one group through its placement; mixed into a c10d class by ``create``."""

    def _setup(self, store, rank: int, size: int, timeout: timedelta) -> None:
        self._rank = rank
        self._size = size
        self._settings = read_settings()
        self._state = GroupState()  # seq, desc, in_collective, error: see there
        self._reductions = ops.Reductions(size)
        self._engine = ProgressEngine(f"rank{rank}")
        self._teardown = threading.Lock()  # shutdown() and abort() may come from any thread, twice
        _configure_logging(rank)
        _torch_compat.warn_if_untested()  # the first group of a process says so on a torch newer than tested
        gloo_exit.install()  # a Gloo group beside this one must not abort the process at exit
        # Load every kernel before any collective, so none compiles on only some ranks.
        kernel_library.warm()
        self._placement = placement.create(store, rank, size, timeout, self._settings, self.describe_current)
        self._sparse_buffers = sparse.Buffers()  # empty until a sparse all_reduce
        self._async_inline = self._placement.async_inline
        # The fast paths' plans (all_reduce, reduce_scatter_tensor, broadcast, all_gather and all_to_all in both
        # forms, reduce, gather, scatter), by (kind, dtype, op value or root), admitted by the general path as
        # it meets them (``_admit``).
        self._fast_plans: dict = {}
        self._reductions_fast = _hash_is_op_value()
        paths = self._placement.compiled_paths()
        self._small = _TakesNone() if paths is None else self._compiled_small_collectives(paths)
        self._small_transfers = _TakesNone() if paths is None else self._compiled_small_transfers(paths.p2p)
        if rank == 0 and _log.isEnabledFor(logging.INFO):
            nodes = self._placement.nodes
            _log.info("%s", "\n".join([f"shm process group of {size} ranks on {len(nodes)} node(s): {nodes}; "
                                       f"timeout {timeout.total_seconds():g} s", *self._placement.summary()]))

    def _compiled_small_collectives(self, paths):
        """The group's first try at all_reduce, broadcast, all_gather (both forms), reduce_scatter_tensor, reduce,
        gather, scatter and all_to_all (both forms) (``ProcessGroupShm``): where the placement has compiled paths
        (``paths``: one node's arena), the calls its fast paths would run inline on the copy path run whole in one
        compiled call, from the group's method to the schedule or the lanes (``_front.SmallCollectives``), which
        returns None for every call it does not take."""
        kinds = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce", "all_to_all", "gather", "scatter")
        return _front.SmallCollectives(
            state=self._state, backlog=self._engine.backlog, debug=DebugSwitch(_log), steps=paths.steps,
            schedule=paths.schedule, plans=self._fast_plans,
            kinds=(descriptors.ALLREDUCE, descriptors.BROADCAST, descriptors.ALLGATHER, descriptors.REDUCE_SCATTER,
                   descriptors.REDUCE, descriptors.ALLTOALL, descriptors.GATHER, descriptors.SCATTER),
            options=(_AllreduceOptions, _BroadcastOptions, _AllgatherOptions, _ReduceScatterOptions,
                     _ReduceOptions, _AllToAllOptions, _GatherOptions, _ScatterOptions),
            limits=tuple(paths.compiled_bytes[kind] for kind in kinds), count_shift=descriptors.COUNT_SHIFT,
            async_try_bytes=paths.async_try_bytes, one_step_bytes=paths.one_step_bytes,
            allreduce_route=paths.allreduce_route, lanes=paths.lanes, align_bytes=lanes_module.ALIGN_BYTES,
            finish_one_shot=allreduce_algorithm.finish_one_shot,
            finish_run=schedule_driver.finish_run, finish_barrier=barrier_algorithm.finish,
            finish_later=self._finish_later, tensor_type=_Tensor, strided=_STRIDED, failed=self._failed,
            profiling=profiling.active, barrier_options=_BarrierOptions,
            barrier_desc=descriptors.descriptor(descriptors.BARRIER), option_offsets=option_fields.offsets,
            completed_type=CompletedWork, shared_completed=self._engine.shared_completed,
            wrappers=_torch_compat.COLLECTIVE_WRAPPERS, size_tables=paths.size_tables,
            alltoall_sizes_error=alltoall_algorithm.sizes_error)

    def _compiled_small_transfers(self, p2p):
        """The group's first try at send and recv (``ProcessGroupShm``): where the placement has compiled paths
        (``p2p``: one node's point-to-point engine), a message that moves whole at once moves in one compiled
        call from the group's method to the channel (``_p2p.SmallTransfers``), which returns None for every call
        it does not take."""
        return _p2p.SmallTransfers(state=self._state, backlog=p2p.backlog, ranks=p2p.ranks, channels=p2p.channels,
                                   lock=p2p.lock, tensor_type=_Tensor, strided=_STRIDED, profiling=profiling.active,
                                   completed=CompletedWork)

    # -- what torch asks of a group ------------------------------------------

    def getBackendName(self) -> str:
        return "shm"

    @property
    def placement(self):
        """Where this group's ranks live (``shmcoll.placement``); for diagnostics and benchmarks."""
        return self._placement

    # -- plumbing ------------------------------------------------------------

    def describe_current(self) -> str:
        """The collective in progress, as errors name it: 'all_reduce(sum, float32, 4096 elements) #17'."""
        return f"{descriptors.describe(self._state.desc)} #{self._state.seq}"

    def _check_usable(self) -> None:
        if self._state.error is not None:
            raise ShmcollError(f"this shm process group is unusable after an earlier error: {self._state.error}")

    def _start(self, desc: int) -> None:
        """Make ``desc`` the collective in progress (named in errors and DEBUG logs), if the group is usable."""
        state = self._state
        if state.error is not None:  # (a call less on every collective's path)
            self._check_usable()
        state.seq += 1
        state.desc = desc
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("rank %d: %s #%d", self._rank, descriptors.describe(desc), state.seq)

    def _run(self, desc: int, body, inputs, event=None, started: bool = False) -> None:
        """Run ``body`` as collective ``desc`` of ``inputs``; a failure of ours makes the group unusable. Its
        profiler event (``profiling``) is ``event`` where the issuing thread began it, else one begun here.
        ``started``: its first part ran already (the compiled small collectives counted it and began it)."""
        if started:
            self._check_usable()
            self._state.desc = desc
        else:
            self._start(desc)
        self._state.in_collective = True  # the arena is in use: teardown must not unmap it under us
        if event is None and _profiling():  # a function call less per collective when no profiler is on
            event = profiling.start(desc, inputs, self._size)
        try:
            body()
        except ShmcollError as error:
            self._failed(error)
            raise
        finally:
            self._state.in_collective = False
            if event is not None:
                profiling.end(event)

    def _failed(self, error: BaseException) -> None:
        """A collective of ours raised ``error``. A ShmcollError leaves it part-way (a peer died, timed out, gave
        up, or disagrees): the group refuses every later call, and the local peers learn that this rank takes
        no further step (``abandon``), or they would wait for it until the timeout. Another error (bad input,
        found before any step) changes nothing."""
        if isinstance(error, ShmcollError):
            self._state.error = self._state.error or error
            self._placement.abandon()

    def _launch(self, desc: int, body, result, opts, inputs=None):
        """Run ``body()`` as collective ``desc`` in issue order; return its Work (with ``result``). ``inputs``: its
        input tensors, for the profiler (default: ``result``)."""
        inputs = result if inputs is None else inputs
        async_op = _is_async(opts)
        now = self._inline(async_op)
        if now is not None:
            return now(desc, body, result, inputs)
        return self._queued(desc, body, result, inputs, async_op, profiling.start(desc, inputs, self._size))

    def _queued(self, desc: int, body, result, inputs, async_op: bool, event=None, started: bool = False):
        """Run ``body()`` as collective ``desc`` through the engine, in issue order: on the progress thread, or
        on a caller's that waits for it (``ProgressEngine.help``); its Work. ``event``: its profiler event, begun
        by the issuing thread; ``started``: as ``_run`` takes it."""
        ran = []

        def run():
            ran.append(True)
            # On the progress thread, waits use the thread's budgets for this collective only.
            background = self._engine.on_thread
            if background:
                self._placement.set_background(True)
            try:
                self._run(desc, body, inputs, event, started)
            finally:
                if background:
                    self._placement.set_background(False)

        try:
            return self._engine.execute(run, result, async_op, lambda: descriptors.describe(desc))
        except BaseException:
            if not ran:  # refused (the group was shut down): its event ends here
                profiling.end(event)
            raise

    def _finish_later(self, desc: int, finish, args: tuple, result, inputs):
        """The rest of an asynchronous collective that the compiled small collectives began and could not end
        without waiting for a peer: ``finish(*args)``, queued in issue order (nothing was queued when it began)
        for the progress thread; its Work, which keeps ``result``, and the queued job ``inputs``, the tensors
        the rest reads by address, until it has run, each in lists of its own (``held``: the front hands the
        caller's). An asynchronous call never waits for a peer on the issuing thread."""
        return self._queued(desc, lambda: finish(*args), result, held(inputs), True, started=True)

    def _inline(self, async_op: bool):
        """How a call runs on the issuing thread, if it does: ``_now`` or ``_now_async``; None: in the engine.

        Only with nothing queued (torch's wrappers, as the fast paths assume, issue from one thread). A
        synchronous call then runs here, without the engine's hand-off and lock (1-2 us of an all_gather
        that single copy finishes in 4); an asynchronous one only where it waits for no peer, which is the
        placement's ``async_inline`` (one rank; on one node the compiled small collectives run an asynchronous
        call as far as it goes without waiting, ``_finish_later`` the rest)."""
        if self._engine.busy():
            return None
        if not async_op:
            return self._now
        return self._now_async if self._async_inline else None

    def _now(self, desc: int, body, result, inputs=None):
        """Run ``body()`` as collective ``desc`` here and now (synchronous, nothing queued); its Work."""
        self._run(desc, body, result if inputs is None else inputs)
        return self._engine.completed(result)

    def _now_async(self, desc: int, body, result, inputs=None):
        """``_now`` for an asynchronous call that waits for no peer: a Work of its own, which the caller may keep
        and wait for later; a failure reaches the caller through it, as from the progress thread (``wait()``
        and the future raise it), not from the call."""
        try:
            self._run(desc, body, result if inputs is None else inputs)
        except Exception as error:
            return self._engine.finished(result, desc, error)
        return self._engine.finished(result, desc)

    def _launch_each(self, calls, step, result, opts, inputs, whole: int | None = None):
        """A coalesced call: ``step(*args, desc)`` for each (*args, desc) of ``calls``, in order, as one Work
        (``inputs``: as ``_launch`` takes them, of all the calls together). ``whole``: the descriptor that names
        the call in its profiler event and its errors, where the first call's would name another collective."""

        def body():
            for *args, desc in calls:
                self._state.desc = desc
                step(*args, desc)

        if whole is None:
            whole = calls[0][-1] if calls else descriptors.descriptor(descriptors.BARRIER)
        return self._launch(whole, body, result, opts, inputs)

    # -- reductions ----------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        # At 8 bytes the shared-memory exchange takes under a microsecond and torch's
        # own all_reduce wrapper about six; every check below is a measurable share
        # of the rest, hence a path of its own for the common case: one contiguous,
        # plain CPU tensor of an (op, dtype) admitted before, a synchronous (or small)
        # call, nothing in flight (``_inline``). It needs no checks (those conditions are
        # what they check), no plan and no packing of the descriptor (both kept from
        # the first call); a small tensor takes the placement's one-shot exchange, a
        # larger one its all-reduce, the same one the general path runs.
        if type(opts) is _AllreduceOptions and type(tensors) is list and len(tensors) == 1:
            tensor = tensors[0]
            if _dense_cpu(tensor) and tensor.is_contiguous():
                count = tensor.numel()
                plan = self._fast_plans.get((descriptors.ALLREDUCE, tensor.dtype, hash(opts.reduceOp)))
                now = None if plan is None else self._inline(opts.asyncOp)
                if now is not None and 0 < count <= descriptors.COUNT_MAX:
                    desc_base, red, one_shot_count = plan
                    desc = desc_base | count << descriptors.COUNT_SHIFT
                    if count <= one_shot_count:
                        return now(desc, lambda: self._placement.one_shot(tensor, count, red, desc), tensors)
                    # red.finish would do nothing: plans that need it are not admitted
                    return now(desc, lambda: self._placement.allreduce(tensor, red, desc), tensors)
        return self._allreduce(tensors, opts)

    def _admit(self, kind: int, dtype, desc: int, redop=None, red: ops.Reduction | None = None, root: int = 0):
        """Let later calls of ``kind`` on ``dtype`` (with ``redop``, or from ``root``) take the fast path, whose
        descriptor is ``desc``'s but for the count: the one place that decides it, for every collective that
        has one. Not reductions whose plan needs something per call or after it (``Reduction.fixed``), nor
        movements of a dtype without an element code (``desc`` counts bytes). A fast path takes a call whose
        (kind, dtype, op value or root; a reduce's: op value x size + root) is in ``_fast_plans`` and that runs
        inline (``_inline``), once its tensors meet the path's own conditions (plain, contiguous, sizes that
        agree)."""
        if red is not None:
            if not (red.fixed and self._reductions_fast):
                return
            which = ops.kind_of(redop).value
            if kind == descriptors.REDUCE:  # a reduce's descriptor names its root too
                which = which * self._size + root
        elif not descriptors.counts_elements(desc):
            return
        else:
            which = root
        key = (kind, dtype, which)
        if key not in self._fast_plans:
            one_shot = self._placement.one_shot_bytes // dtype.itemsize if kind == descriptors.ALLREDUCE else 0
            self._fast_plans[key] = _FastPlan(descriptors.without_count(desc), red, one_shot)

    def _allreduce(self, tensors, opts):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if len(tensors) == 1 and isinstance(tensors[0], torch.Tensor) and tensors[0].is_sparse:
            return self._allreduce_sparse(checks.sparse(tensors[0], "all_reduce"), opts)
        tensor = checks.one_tensor(tensors, "all_reduce")
        red = self._reductions.plan(_reduce_op(opts), tensor.dtype, "all_reduce")
        count = red.view(tensor).numel()
        desc = descriptors.descriptor(descriptors.ALLREDUCE, count, red.dtype.code, red.code)
        self._admit(descriptors.ALLREDUCE, tensor.dtype, desc, _reduce_op(opts), red)

        def body():
            self._placement.allreduce(tensor, red, desc)
            red.finish(tensor)

        return self._launch(desc, body, [tensor], opts)

    def _allreduce_sparse(self, tensor, opts):
        sparse.check_op(_reduce_op(opts))
        desc = descriptors.descriptor(descriptors.ALLREDUCE, tensor._nnz(), ops.movement_code(tensor.dtype))
        return self._launch(desc, lambda: sparse.allreduce(tensor, self._placement, self._rank, self._size,
                                                           self._sparse_buffers), [tensor], opts)

    def allreduce_sparse(self, tensors, opts=None):
        """c10d's other name for the sparse all-reduce; the same as ``allreduce``'s."""
        return self._allreduce(tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        """All tensors reduced as one flat buffer: one collective, not one per tensor."""
        checks.same_dtype(tensors, "all_reduce_coalesced")
        if not tensors:
            return self._engine.completed([])
        red = self._reductions.plan(_reduce_op(opts), tensors[0].dtype, "all_reduce_coalesced")
        count = sum(red.view(t).numel() for t in tensors)
        desc = descriptors.descriptor(descriptors.ALLREDUCE, count, red.dtype.code, red.code)

        def body():
            flat = torch.cat([t.reshape(-1) for t in tensors])
            self._placement.allreduce(flat, red, desc)
            red.finish(flat)
            offset = 0
            for t in tensors:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()

        return self._launch(desc, body, list(tensors), opts)

    def reduce(self, tensors, opts=None):
        tensor = checks.one_tensor(tensors, "reduce")
        root = checks.root(opts.rootRank if opts is not None else 0, self._size, "reduce")
        red = self._reductions.plan(_reduce_op(opts), tensor.dtype, "reduce")
        desc = descriptors.descriptor(descriptors.REDUCE, red.view(tensor).numel(), red.dtype.code, red.code, root)
        self._admit(descriptors.REDUCE, tensor.dtype, desc, _reduce_op(opts), red, root)

        def body():
            self._placement.reduce(tensor, root, red, desc)
            if self._rank == root:
                red.finish(tensor)

        return self._launch(desc, body, [tensor], opts)

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        output = checks.one_tensor(output_tensors, "reduce_scatter output")
        inputs = checks.blocks(input_lists, self._size, output, self._rank, "reduce_scatter input")
        if any(t.numel() != output.numel() for t in inputs):
            return self._reduce_scatter_uneven(output, inputs, opts)
        return self._reduce_scatter(output, lambda: torch.cat([t.reshape(-1) for t in inputs]), opts, inputs)

    def _reduce_scatter_uneven(self, output, inputs, opts):
        """reduce_scatter's list form with blocks of different sizes: a reduce of each rank's block to that rank
        (as NCCL runs it), as one Work; the root reduces its block into its output, the others a copy of theirs
        (a reduce may use a non-root's tensor as scratch)."""
        red = self._reductions.plan(_reduce_op(opts), output.dtype, "reduce_scatter")
        calls = [(root, block, descriptors.descriptor(descriptors.REDUCE, red.view(block).numel(), red.dtype.code,
                                                      red.code, root))
                 for root, block in enumerate(inputs)]

        def reduce(root, block, desc):
            if root != self._rank:
                return self._placement.reduce(block.clone(), root, red, desc)
            output.copy_(block)
            self._placement.reduce(output, root, red, desc)
            red.finish(output)

        whole = descriptors.descriptor(descriptors.REDUCE_SCATTER, red.view(output).numel(), red.dtype.code, red.code)
        return self._launch_each(calls, reduce, [output], opts, list(inputs), whole)

    def reduce_scatter_single(self, output, input, opts=None):
        # all_reduce's fast path (see there) for FSDP2's gradient reduce-scatters and tensor-parallel
        # layers: plain tensors, a contiguous input, a synchronous (or small) call, an (op, dtype) met before
        # whose plan needs nothing per call or after it (``Reduction.fixed``), nothing in flight. Any placement.
        if type(opts) is _ReduceScatterOptions and _dense_cpu(output) and _dense_cpu(input) and input.is_contiguous():
            count = output.numel()
            plan = self._fast_plans.get((descriptors.REDUCE_SCATTER, output.dtype, hash(opts.reduceOp)))
            now = None if plan is None else self._inline(opts.asyncOp)
            if (now is not None and input.dtype is output.dtype and input.numel() == count * self._size
                    and count <= descriptors.COUNT_MAX):
                base, red, _ = plan
                desc = base | count << descriptors.COUNT_SHIFT
                return now(desc, lambda: self._placement.reduce_scatter(output, input, red, desc), [output], [input])
        checks.gathered(input, output, self._size, "reduce_scatter_tensor", "input", "output")
        # Only the input's data is read, so a contiguous one is not flattened (reshape costs a microsecond).
        return self._reduce_scatter(output, lambda: input if input.is_contiguous() else input.contiguous(), opts,
                                    [input])

    def _reduce_scatter(self, output, stacked, opts, inputs):
        """``stacked()``: a contiguous tensor of every rank's block for ``output``, in rank order (``inputs``
        as the caller gave them)."""
        red = self._reductions.plan(_reduce_op(opts), output.dtype, "reduce_scatter")
        desc = descriptors.descriptor(descriptors.REDUCE_SCATTER, red.view(output).numel(), red.dtype.code, red.code)
        self._admit(descriptors.REDUCE_SCATTER, output.dtype, desc, _reduce_op(opts), red)

        def body():
            self._placement.reduce_scatter(output, stacked(), red, desc)
            red.finish(output)

        return self._launch(desc, body, [output], opts, inputs)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        checks.pairs(outputs, inputs, "reduce_scatter_tensor_coalesced")
        scatters = []
        for output, input in zip(outputs, inputs):
            checks.gathered(input, output, self._size, "reduce_scatter_tensor_coalesced", "input", "output")
            red = self._reductions.plan(_reduce_op(opts), output.dtype, "reduce_scatter_tensor_coalesced")
            desc = descriptors.descriptor(descriptors.REDUCE_SCATTER, red.view(output).numel(), red.dtype.code,
                                          red.code)
            self._admit(descriptors.REDUCE_SCATTER, output.dtype, desc, _reduce_op(opts), red)
            scatters.append((output, input.contiguous(), red, desc))

        def reduce_scatter(output, input, red, desc):
            self._placement.reduce_scatter(output, input, red, desc)
            red.finish(output)

        return self._launch_each(scatters, reduce_scatter, list(outputs), opts, list(inputs))

    # -- data movement -------------------------------------------------------

    def broadcast(self, tensors, opts=None):
        # all_reduce's fast path (see there): one plain tensor of a (dtype, root) met before, synchronous
        # (or small).
        if type(opts) is _BroadcastOptions and type(tensors) is list and len(tensors) == 1:
            tensor = tensors[0]
            if _dense_cpu(tensor):
                root, count = opts.rootRank, tensor.numel()
                plan = self._fast_plans.get((descriptors.BROADCAST, tensor.dtype, root))
                now = None if plan is None else self._inline(opts.asyncOp)
                if now is not None and count <= descriptors.COUNT_MAX:
                    desc = plan.desc_base | count << descriptors.COUNT_SHIFT
                    return now(desc, lambda: self._placement.broadcast(tensor, root, desc), [tensor])
        tensor = checks.one_tensor(tensors, "broadcast")
        root = checks.root(opts.rootRank if opts is not None else 0, self._size, "broadcast")
        desc = descriptors.descriptor(descriptors.BROADCAST, *ops.movement(tensor), 0, root)
        self._admit(descriptors.BROADCAST, tensor.dtype, desc, root=root)
        return self._launch(desc, lambda: self._placement.broadcast(tensor, root, desc), [tensor], opts)

    def allgather(self, output_lists, input_tensors, opts=None):
        tensor = checks.one_tensor(input_tensors, "all_gather")
        outputs = checks.one_list_like(output_lists, self._size, tensor, "all_gather output")
        desc = descriptors.descriptor(descriptors.ALLGATHER, *ops.movement(tensor))
        self._admit(descriptors.ALLGATHER, tensor.dtype, desc)
        return self._launch(desc, lambda: self._placement.allgather(outputs, tensor, desc), output_lists, opts,
                            [tensor])

    def all_gather_single(self, output, input, opts=None):
        # all_reduce's fast path (see there) for FSDP2's parameter all-gathers and tensor-parallel decode:
        # plain tensors of a dtype met before, a synchronous (or small) call, nothing in flight. Any placement.
        if type(opts) is _AllgatherOptions and _dense_cpu(input) and _dense_cpu(output):
            count = input.numel()
            plan = self._fast_plans.get((descriptors.ALLGATHER, input.dtype, 0))
            now = None if plan is None else self._inline(opts.asyncOp)
            if (now is not None and output.dtype is input.dtype and output.numel() == count * self._size
                    and count <= descriptors.COUNT_MAX):
                desc = plan.desc_base | count << descriptors.COUNT_SHIFT
                return now(desc, lambda: self._placement.allgather_into(output, input, desc), [output], [input])
        checks.gathered(output, input, self._size, "all_gather_into_tensor", "output", "input")
        desc = descriptors.descriptor(descriptors.ALLGATHER, *ops.movement(input))
        self._admit(descriptors.ALLGATHER, input.dtype, desc)
        return self._launch(desc, lambda: self._placement.allgather_into(output, input, desc), [output], opts,
                            [input])

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """``output_lists[r][i]`` receives rank r's ``input_list[i]`` (torch's documented layout, as Gloo's)."""
        output_lists = checks.list_of_size(output_lists, self._size, "all_gather_coalesced output lists")
        for i, tensor in enumerate(input_list):
            checks.tensor(tensor, f"all_gather_coalesced input[{i}]")
        for r, outputs in enumerate(output_lists):
            if len(outputs) != len(input_list):
                raise ValueError(f"all_gather_coalesced: output list {r} has {len(outputs)} tensors for "
                                 f"{len(input_list)} inputs")
            for i, (output, tensor) in enumerate(zip(outputs, input_list)):
                checks.like([output], tensor, f"all_gather_coalesced output_lists[{r}][{i}]")
        gathers = [([outputs[i] for outputs in output_lists], tensor,
                    descriptors.descriptor(descriptors.ALLGATHER, *ops.movement(tensor)))
                   for i, tensor in enumerate(input_list)]
        return self._launch_each(gathers, self._placement.allgather, output_lists, opts, list(input_list))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        checks.pairs(outputs, inputs, "all_gather_into_tensor_coalesced")
        gathers = []
        for output, input in zip(outputs, inputs):
            checks.gathered(output, input, self._size, "all_gather_into_tensor_coalesced", "output", "input")
            desc = descriptors.descriptor(descriptors.ALLGATHER, *ops.movement(input))
            self._admit(descriptors.ALLGATHER, input.dtype, desc)
            gathers.append((output, input, desc))
        return self._launch_each(gathers, self._placement.allgather_into, list(outputs), opts, list(inputs))

    def gather(self, output_lists, input_tensors, opts=None):
        tensor = checks.one_tensor(input_tensors, "gather")
        root, outputs = checks.rooted(opts, output_lists, tensor, self._size, self._rank, "gather", "output")
        desc = descriptors.descriptor(descriptors.GATHER, *ops.movement(tensor), 0, root)
        self._admit(descriptors.GATHER, tensor.dtype, desc, root=root)
        return self._launch(desc, lambda: self._placement.gather(outputs, tensor, root, desc), output_lists, opts,
                            inputs=[tensor])

    def scatter(self, output_tensors, input_lists, opts=None):
        output = checks.one_tensor(output_tensors, "scatter output")
        root, inputs = checks.rooted(opts, input_lists, output, self._size, self._rank, "scatter", "input")
        desc = descriptors.descriptor(descriptors.SCATTER, *ops.movement(output), 0, root)
        self._admit(descriptors.SCATTER, output.dtype, desc, root=root)
        return self._launch(desc, lambda: self._placement.scatter(output, inputs, root, desc), [output], opts,
                            inputs=inputs or [])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        outputs = checks.list_of_size(output_tensors, self._size, "all_to_all output list")
        inputs = checks.list_of_size(input_tensors, self._size, "all_to_all input list")
        checks.same_dtype(inputs, "all_to_all input")
        checks.same_dtype(outputs, "all_to_all output")
        if outputs[0].dtype != inputs[0].dtype:
            raise ValueError(f"all_to_all: the outputs are {outputs[0].dtype}, the inputs {inputs[0].dtype}")
        # No count: each rank knows only its own sizes (the collective exchanges them; see algorithms.alltoall).
        desc = descriptors.descriptor(descriptors.ALLTOALL, 0, ops.movement_code(inputs[0].dtype))
        self._admit(descriptors.ALLTOALL, inputs[0].dtype, desc)  # the plan of both forms
        return self._launch(desc, lambda: self._placement.alltoall(outputs, inputs, desc), output_tensors, opts,
                            inputs=inputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        checks.tensor(input, "all_to_all_single input")
        checks.tensor(output, "all_to_all_single output")
        if output.dtype != input.dtype:
            raise ValueError(f"all_to_all_single: output is {output.dtype}, input is {input.dtype}")
        in_blocks = checks.split_bytes(input, input_split_sizes, self._size, "input")
        out_blocks = checks.split_bytes(output, output_split_sizes, self._size, "output")
        # Whether a rank passed split sizes is its own affair (Gloo's contract): every rank's blocks are
        # explicit from here on, and the collective exchanges them (see algorithms.alltoall).
        desc = descriptors.descriptor(descriptors.ALLTOALL, 0, ops.movement_code(input.dtype))
        self._admit(descriptors.ALLTOALL, input.dtype, desc)
        return self._launch(desc, lambda: self._placement.alltoall_single(output, input, out_blocks, in_blocks,
                                                                          desc), [output], opts, inputs=[input])

    def barrier(self, opts=None):
        desc = descriptors.descriptor(descriptors.BARRIER)
        return self._launch(desc, lambda: self._placement.barrier(desc), [], opts)

    # -- point-to-point ------------------------------------------------------

    def send(self, tensors, dstRank: int, tag: int = 0):
        tensor = checks.one_tensor(tensors, "send")
        dst = checks.peer(dstRank, self._rank, self._size, "send")
        self._check_usable()  # like every collective: after an error, peers may be anywhere
        event = profiling.start_p2p("send", tensor, dst, tag, self._size)
        return ending(self._placement.send(tensor, dst, tag), event)

    def recv(self, tensors, srcRank: int, tag: int = 0):
        tensor = checks.one_tensor(tensors, "recv")
        src = checks.peer(srcRank, self._rank, self._size, "recv")
        return self._receive(tensor, src, tag)

    def recv_anysource(self, tensors, tag: int = 0):
        return self._receive(checks.one_tensor(tensors, "recv"), None, tag)

    def _receive(self, tensor, src: int | None, tag: int):
        """A receive from ``src`` (None: any rank). The placements receive into contiguous memory: a tensor that
        is not contiguous gets a contiguous stand-in, copied into it once the message is in (``WritingBack``).
        Refusing it instead (as Gloo does) would leave the sender's message for the next receive."""
        self._check_usable()
        event = profiling.start_p2p("recv", tensor, src, tag, self._size)
        target = staging.staged_empty(tensor)
        work = ending(self._placement.recv(target, src, tag), event)
        return work if target is tensor else WritingBack(work, [(tensor, target)], [tensor])

    # -- teardown ------------------------------------------------------------

    def shutdown(self) -> None:
        """Finish queued work, stop our threads, release the placement (unmap the arena, shut its Gloo
        groups down). What destroy_process_group calls; safe twice and from any thread."""
        with self._teardown:
            if self._placement is not None:
                self._engine.close()
                # Refused from here on, before the arena goes: the compiled small collectives hold the arena
                # itself, not the placement, and check only this.
                self._state.error = self._state.error or ShmcollError("this shm process group was shut down")
                _until(lambda: not self._state.in_collective, None)  # one still running on another thread
                self._placement.close()
                self._placement = None

    def abort(self) -> None:
        """Get out of a hung collective: the one in progress (on any thread) raises within a wait slice,
        queued ones fail, local peers waiting on this rank raise too, then everything is released.
        Safe twice and from any thread."""
        with self._teardown:
            placement = self._placement
            if placement is None:
                return
            error = AbortedError(f"rank {self._rank}: this shm process group was aborted")
            self._state.error = self._state.error or error
            placement.abort("abort() was called on this process group")
            deadline = time.monotonic() + ABORT_GRACE_S
            if not (self._engine.abort(error, ABORT_GRACE_S)
                    and _until(lambda: not self._state.in_collective, deadline)):
                # A collective still runs (in a Gloo call between nodes, which has no abort): unmapping
                # under it could crash the process; the mapping goes when the process does.
                _log.warning("rank %d: abort(): a collective still runs after %g s; the shm arena stays "
                             "mapped", self._rank, ABORT_GRACE_S)
                return
            placement.close()
            self._placement = None


# How long abort() waits for the collective in progress to notice it: a wait notices within one slice.
ABORT_GRACE_S = 5.0


def _until(condition, deadline: float | None) -> bool:
    """Poll ``condition()`` every millisecond until it holds (True) or ``deadline`` passes (False)."""
    while not condition():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


class _TakesNone:
    """The compiled small collectives where the placement has none: every call goes the Python way."""

    def allreduce(self, tensors, opts) -> None:
        return None

    broadcast = reduce = allreduce

    def allgather_into(self, output, input, opts) -> None:
        return None

    allgather = reduce_scatter = gather = scatter = alltoall = allgather_into

    def alltoall_single(self, output, input, output_split_sizes, input_split_sizes, opts) -> None:
        return None

    def barrier(self, opts) -> None:
        return None

    def send(self, tensors, peer, tag) -> None:
        return None

    recv = send
