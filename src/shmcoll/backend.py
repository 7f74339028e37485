"""ProcessGroupShm: the torch.distributed surface of the shm backend.

Every method opens the same way: check the arguments, take the single-rank
shortcut, then hand raw addresses to one algorithm in ``shmcoll.algorithms``,
run in issue order by the group's ProgressEngine (inline when synchronous and
nothing is queued; on the progress thread otherwise).
"""
from __future__ import annotations

import functools
import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions  # not re-exported by torch.distributed

from shmcoll import kernel_library, ops, topology
from shmcoll._logging import configure as _configure_logging
from shmcoll._logging import log as _log
from shmcoll._env import read_settings
from shmcoll.algorithms import allgather as _allgather
from shmcoll.algorithms import allreduce as _allreduce
from shmcoll.algorithms import alltoall as _alltoall
from shmcoll.algorithms import barrier as _barrier
from shmcoll.algorithms import broadcast as _broadcast
from shmcoll.algorithms import gather as _gather
from shmcoll.algorithms import reduce_scatter as _reduce_scatter
from shmcoll.algorithms import scatter as _scatter
from shmcoll.errors import ShmcollError
from shmcoll.hierarchy import Hierarchy
from shmcoll.node_arena import open_node_arena
from shmcoll.p2p import PointToPoint, Recv, Send
from shmcoll.staging import staged as _staged
from shmcoll.staging import staged_empty as _staged_empty
from shmcoll.staging import unstage as _unstage
from shmcoll.work import CompletedWork, ProgressEngine

# Our method name -> the C++ Backend's Python name, where they differ.
_BACKEND_NAMES = {"_allreduce_general": "allreduce", "all_gather_single": "_allgather_base",
                  "reduce_scatter_single": "_reduce_scatter_base", "all_to_all_single": "alltoall_base",
                  "allgather_into_tensor_coalesced": "allgather_coalesced"}

_STRIDED = torch.strided

_COMPLEX_OPS = {dist.ReduceOp.RedOpType.SUM, dist.ReduceOp.RedOpType.AVG, dist.ReduceOp.RedOpType.PREMUL_SUM}


def _wait_policy(settings, local_size: int) -> tuple[int, int]:
    """Spin and yield budgets (ns) of every wait.

    A pure spin reacts fastest but holds the core; a sched_yield loop is almost
    as quick when the core is otherwise idle and hands the core over when a
    peer (or anything else) is runnable on it. So: a short spin, unless local
    ranks outnumber cores, then yields, then the futex sleep.
    """
    cores = len(os.sched_getaffinity(0))
    oversubscribed = local_size > cores
    spin_us = settings.spin_us if settings.spin_us is not None else (0.0 if oversubscribed else 20.0)
    yield_us = settings.yield_us if settings.yield_us is not None else (200.0 if oversubscribed else 500.0)
    return int(spin_us * 1000), int(yield_us * 1000)


def _thread_waits(settings) -> tuple[int, int] | None:
    """Wait budgets (spin ns, yield ns) of collectives on the progress thread; None: the arena's own.

    An async collective runs while the caller computes, typically on the same
    cores (DDP's backward): spinning or yielding there takes cycles from the
    computation it overlaps, so those waits sleep on the futex at once
    (measured on DDP with 2 ranks on 2 cores: communication overhead per step
    50-53 -> 42-44 ms). Explicit SHMCOLL_SPIN_US / SHMCOLL_YIELD_US apply to both.
    """
    explicit = settings.spin_us is not None or settings.yield_us is not None
    return None if explicit else (0, 0)


def _first_tensor(args):
    """The first tensor in a collective's arguments (tensors, lists, or lists of lists)."""
    for arg in args:
        while isinstance(arg, (list, tuple)) and arg:
            arg = arg[0]
        if isinstance(arg, torch.Tensor):
            return arg
    return None


def _route_devices(method):
    """Send calls on non-CPU tensors to the group's backend for that device (e.g. 'cuda:nccl')."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self, *args):
        tensor = _first_tensor(args)
        if tensor is not None and not tensor.is_cpu:
            return self._on_device(tensor.device, name, args)
        return method(self, *args)

    return wrapper


def _check_tensor(tensor, what: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_cpu:
        raise ValueError(f"{what}: the shm backend handles CPU tensors only, got a tensor on {tensor.device}; "
                         f"use init_process_group('cpu:shm,cuda:nccl') to route device tensors elsewhere")
    if tensor.layout is not _STRIDED:
        raise ValueError(f"{what}: the shm backend handles dense tensors only, got layout {tensor.layout}")


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


class ProcessGroupShm(dist.ProcessGroup):
    """CPU collectives through a shared-memory arena per node."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self._timeout = timeout
        self._settings = read_settings()
        self._error: BaseException | None = None
        self._arena = None
        self._gloo = None  # the flat Gloo group over all ranks, on several nodes only
        self._hierarchy = None  # node arena + rails, on several nodes only
        self._seq = 0  # collectives started on this group, for messages
        self._desc = 0  # descriptor of the collective in progress
        self._plans: dict = {}  # (reduce op kind, dtype) -> resolved reduction
        self._small: dict | None = None  # (reduce op value, dtype) -> small all-reduce plan, on one node
        self._engine = ProgressEngine(f"rank{rank}")
        self._node_arena = None  # this rank's node arena (single node or hierarchy), if it has one
        self._inline_waits = None  # that arena's own (spin ns, yield ns)
        self._thread_waits = None  # what collectives on the progress thread use instead, if anything
        self._p2p = None
        _configure_logging(rank)
        # Load every kernel before any collective, so none compiles on only some ranks.
        kernel_library.warm()
        if size == 1:
            return
        # torch reuses a group's store prefix when a process initialises again, so every
        # key of ours lives under this incarnation's number: each rank adds 1 once.
        incarnation = (store.add("shmcoll/incarnation", 1) - 1) // size
        keys = f"shmcoll/{incarnation}"
        topo = topology.discover(store, rank, size, topology.host_identity(self._settings.hostid), keys)
        # A rank that cannot map its node's arena becomes a node of its own (even in a one-node job).
        topo, arena = open_node_arena(store, rank, size, topo, self._settings, timeout,
                                      lambda local_size: _wait_policy(self._settings, local_size), keys)
        if arena is not None:
            arena._describe = self._describe_current
            self._node_arena = arena
            self._inline_waits = (arena.spin_ns, arena.yield_ns)
            self._thread_waits = _thread_waits(self._settings)
        if topo.single_node:
            self._arena = arena
            self._p2p = PointToPoint(self._arena, f"rank{rank}")
            self._small = {}
        else:
            self._hierarchy = Hierarchy(store, rank, size, timeout, topo, arena, keys)
            self._gloo = self._hierarchy.flat
        if rank == 0 and _log.isEnabledFor(logging.INFO):
            _log.info("%s", self._summary(topo))

    def _summary(self, topo) -> str:
        """What this group will do, in a few lines (logged at INFO on its first rank)."""
        s = self._settings
        arena = self._node_arena
        lines = [f"shm process group of {self._size} ranks on {len(topo.nodes)} node(s): {topo.nodes}"]
        if arena is not None:
            lines.append(f"  arena: {arena.segment.size / 2**20:.1f} MiB for {arena.local_size} local ranks, "
                         f"{s.chunk_bytes // 1024} KiB chunks, {s.p2p_bytes // 1024} KiB p2p channels")
        small = min(s.small_bytes, s.chunk_bytes)
        lines.append(f"  all_reduce: one-shot up to {small} B, chunked reduce-scatter + all-gather above")
        if self._hierarchy is not None:
            lines.append("  across nodes: intra-node reduce-scatter, Gloo rail all_reduce, intra-node all-gather; "
                         "ops without a hierarchical plan run on a flat Gloo group")
        spin_ns, yield_ns = _wait_policy(s, len(topo.local_ranks))
        lines.append(f"  waits: spin {spin_ns / 1000:g} us, sched_yield {yield_ns / 1000:g} us, then futex sleep "
                     f"({len(os.sched_getaffinity(0))} usable CPUs); timeout {self._timeout.total_seconds():g} s")
        return "\n".join(lines)

    # -- torch.distributed hooks ---------------------------------------------

    def getBackendName(self) -> str:
        return "shm"

    # torch names every group it creates; the base class keeps the name in its
    # C++ backends, which a Python ProcessGroup has none of, so keep it here
    # (DeviceMesh, FSDP2 and functional collectives look groups up by name).
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        name = getattr(self, "_group_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return getattr(self, "_group_desc", "undefined")

    @property
    def options(self) -> None:
        return None

    # -- plumbing ------------------------------------------------------------

    def _describe_current(self, step: int | None = None) -> str:
        return f"{ops.describe_desc(self._desc)} #{self._seq}"

    def _start(self, desc: int) -> None:
        """Make ``desc`` the collective in progress (named in errors and DEBUG logs), if the group is usable."""
        self._check_usable()
        self._seq += 1
        self._desc = desc
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("rank %d: %s #%d", self._rank, ops.describe_desc(desc), self._seq)

    def _launch(self, desc: int, body, result, opts):
        """Run ``body()`` as collective ``desc`` in issue order; return its Work."""

        def run():
            self._start(desc)
            # On the progress thread, waits use the thread's budgets for this collective only, so an
            # inline collective (the small all-reduce path included) always finds the arena's own.
            background = self._thread_waits is not None and self._engine.on_thread
            if background:
                self._node_arena.set_waits(*self._thread_waits)
            try:
                return body()
            except ShmcollError as error:
                self._error = error
                raise
            finally:
                if background:
                    self._node_arena.set_waits(*self._inline_waits)

        async_op = True if opts is None else opts.asyncOp
        return self._engine.execute(run, result, async_op, lambda: ops.describe_desc(desc))

    def _one_tensor(self, tensors, what: str) -> torch.Tensor:
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if len(tensors) != 1:
            raise ValueError(f"{what}: the shm backend takes exactly one tensor per call, got {len(tensors)}")
        _check_tensor(tensors[0], what)
        return tensors[0]

    def _root(self, root: int, what: str) -> int:
        if not 0 <= root < self._size:
            raise ValueError(f"{what}: root rank {root} is not in this group of {self._size} ranks")
        return root

    def _reduction(self, redop, tensor, what: str):
        """(op, dtype, kernel, scale, tensor to reduce) for a reduction of ``tensor``; cached per kind."""
        kind = redop.op if isinstance(redop, dist.ReduceOp) else redop
        plan = self._plans.get((kind, tensor.dtype))
        if plan is None:
            plan = self._plans[(kind, tensor.dtype)] = self._plan_reduction(kind, tensor, what)
            if self._small is not None:
                self._plan_small(kind, tensor.dtype)
        op, dtype, kernel, scale, as_real, premul = plan
        if premul:  # a flag: comparing pybind enums costs half a microsecond
            scale = ops.premul_factor(redop)
        return op, dtype, kernel, scale, (torch.view_as_real(tensor) if as_real else tensor)

    def _plan_reduction(self, kind, tensor, what: str):
        as_real = tensor.is_complex()
        if as_real:
            if kind not in _COMPLEX_OPS:
                raise ValueError(f"{what}: {kind} is not defined for complex tensors (only SUM, AVG, PREMUL_SUM)")
            tensor = torch.view_as_real(tensor)
        op, dtype = ops.reduce_op(kind, tensor.dtype)
        kernel = kernel_library.entry_point(dtype.name)  # called by address from shmcoll._reduce
        scale = float(self._size) if op.average else 1.0
        return op, dtype, kernel, scale, as_real, kind == dist.ReduceOp.RedOpType.PREMUL_SUM

    def _same_shape(self, tensors, like, what: str) -> None:
        for i, t in enumerate(tensors):
            _check_tensor(t, f"{what}[{i}]")
            if t.dtype != like.dtype or t.numel() != like.numel():
                raise ValueError(f"{what}[{i}] is {t.dtype} with {t.numel()} elements; expected {like.dtype} "
                                 f"with {like.numel()} elements")

    def _list_of_size(self, tensors, what: str):
        if len(tensors) != self._size:
            raise ValueError(f"{what} has {len(tensors)} tensors; the group has {self._size} ranks")
        return tensors

    def _on_device(self, device, name: str, args):
        try:
            backend = self._get_backend(device)
        except RuntimeError:
            backend = None
        if backend is None or backend is self:
            raise ValueError(f"{name}: the shm backend handles CPU tensors only, got a tensor on {device}; "
                             f"name a backend for that device, e.g. init_process_group('cpu:shm,cuda:nccl')")
        return getattr(backend, _BACKEND_NAMES.get(name, name))(*args)

    def _empty(self, desc: int, result, opts):
        """A collective on empty tensors is still one: take part (no data), so that a rank
        calling it with data is not left waiting and disagreements on the count are caught."""
        if self._arena is None:  # several nodes: nothing to move, nothing to check
            self._check_usable()
            return CompletedWork(result)
        return self._launch(desc, lambda: _barrier.barrier(self._arena, self._desc), result, opts)

    def _delegate(self, name: str, *args):
        self._engine.drain()  # after every hierarchical collective issued before it
        self._check_usable()  # a failed hierarchical plan may have left peers anywhere
        return getattr(self._gloo, name)(*args)

    def _check_usable(self) -> None:
        """Raise what ``_launch`` raises once a collective of this group failed."""
        if self._error is not None:
            raise ShmcollError(f"this shm process group is unusable after an earlier error: {self._error}")

    def _flat_only(self, name: str) -> bool:
        """Several nodes and no hierarchical plan for ``name`` on them: the flat Gloo group runs it."""
        return self._gloo is not None and not self._hierarchy.has_plan(name)

    def _across_nodes(self, name: str, desc: int, result, opts, *args):
        """Run the hierarchy's plan ``name`` as collective ``desc``."""
        plan = getattr(self._hierarchy, name)
        return self._launch(desc, lambda: plan(*args, self._desc), result, opts)

    # -- reductions ----------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions | None = None) -> dist.Work:
        # At 8 bytes the shared-memory exchange takes under a microsecond and
        # torch's own all_reduce wrapper about six; every check below is a
        # measurable share of the rest, hence a path of its own for the
        # common case: one small, contiguous, real CPU tensor, a synchronous
        # call, one node, nothing in flight (see _small_allreduce).
        small = self._small
        if small is not None and opts is not None and len(tensors) == 1 and not opts.asyncOp:
            tensor = tensors[0]
            if (isinstance(tensor, torch.Tensor) and tensor.is_cpu and tensor.layout is _STRIDED
                    and tensor.is_contiguous()):
                # Keyed on the op's integer value: hashing the pybind enum itself costs a microsecond.
                plan = small.get((opts.reduceOp.op.value, tensor.dtype))
                if plan is not None:
                    count = tensor.numel()
                    if 0 < count <= plan[0] and not self._engine.busy():
                        return self._small_allreduce(tensor, count, plan, tensors)
        return self._allreduce_general(tensors, opts)

    def _small_allreduce(self, tensor, count: int, plan, tensors):
        """One-shot all-reduce, inline; returns the group's reusable completed Work."""
        _, desc_base, itemsize, kernel, op, scale = plan
        desc = desc_base | count << ops.COUNT_SHIFT
        self._start(desc)
        try:
            _allreduce.one_shot(self._arena, tensor.data_ptr(), count, itemsize, kernel, op, scale, desc)
        except ShmcollError as error:
            self._error = error
            raise
        return self._engine.completed(tensors)

    def _plan_small(self, kind, dtype) -> None:
        """Admit (kind, dtype) to the small all-reduce path once its reduction is planned."""
        if self._arena is None or dtype.is_complex or kind == dist.ReduceOp.RedOpType.PREMUL_SUM:
            return
        op, shm_dtype, kernel, scale, _, _ = self._plans[(kind, dtype)]
        itemsize = dtype.itemsize
        max_count = min(self._settings.small_bytes, self._arena.chunk_bytes) // itemsize
        desc_base = ops.descriptor(ops.ALLREDUCE, 0, shm_dtype.code, op.code)
        self._small[(kind.value, dtype)] = (max_count, desc_base, itemsize, kernel, op.kernel, scale)

    @_route_devices
    def _allreduce_general(self, tensors, opts=None):
        tensor = self._one_tensor(tensors, "all_reduce")
        redop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        op, dtype, kernel, scale, flat = self._reduction(redop, tensor, "all_reduce")
        if self._flat_only("allreduce"):
            return self._delegate("allreduce", [tensor], opts)
        count = flat.numel()
        if self._size == 1:
            if scale != 1.0 and not op.average and count:
                tensor.mul_(scale)
            return CompletedWork([tensor])
        desc = ops.descriptor(ops.ALLREDUCE, count, dtype.code, op.code)
        if count == 0:
            return self._empty(desc, [tensor], opts)
        if self._hierarchy is not None:
            return self._across_nodes("allreduce", desc, [tensor], opts, flat, op, dtype, kernel, scale)
        itemsize = flat.element_size()
        arena = self._arena
        plan = (_allreduce.one_shot if count * itemsize <= min(self._settings.small_bytes, arena.chunk_bytes)
                else _allreduce.reduce_scatter_allgather)

        def body():
            work = _staged(flat)
            plan(arena, work.data_ptr(), count, itemsize, kernel, op.kernel, scale, self._desc)
            _unstage(flat, work)

        return self._launch(desc, body, [tensor], opts)

    @_route_devices
    def allreduce_coalesced(self, tensors: list[torch.Tensor],
                            opts: dist.AllreduceCoalescedOptions | None = None) -> dist.Work:
        """All tensors reduced as one flat buffer (one collective, not one per tensor)."""
        if self._gloo is not None:
            return self._delegate("allreduce_coalesced", tensors, opts)
        if not tensors:
            return CompletedWork([])
        for i, t in enumerate(tensors):
            _check_tensor(t, f"all_reduce_coalesced[{i}]")
            if t.dtype != tensors[0].dtype:
                raise ValueError(f"all_reduce_coalesced: tensor {i} is {t.dtype}, tensor 0 is {tensors[0].dtype}")
        flat = torch.cat([t.reshape(-1) for t in tensors])
        inner = dist.AllreduceOptions()
        inner.reduceOp = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        inner.asyncOp = False
        self.allreduce([flat], inner)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
        return CompletedWork(list(tensors))

    @_route_devices
    def reduce(self, tensors: list[torch.Tensor], opts: dist.ReduceOptions | None = None) -> dist.Work:
        tensor = self._one_tensor(tensors, "reduce")
        root = self._root(opts.rootRank if opts is not None else 0, "reduce")
        redop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        op, dtype, kernel, scale, flat = self._reduction(redop, tensor, "reduce")
        if self._gloo is not None:
            return self._delegate("reduce", [tensor], opts)
        count = flat.numel()
        if self._size == 1 or count == 0:
            if scale != 1.0 and not op.average and count:
                tensor.mul_(scale)
            return CompletedWork([tensor])
        itemsize = flat.element_size()

        def body():
            work = _staged(flat)
            _allreduce.reduce_scatter_allgather(self._arena, work.data_ptr(), count, itemsize, kernel, op.kernel,
                                                scale, self._desc, root=root)
            if self._rank == root:
                _unstage(flat, work)

        return self._launch(ops.descriptor(ops.REDUCE, count, dtype.code, op.code, root), body, [tensor], opts)

    @_route_devices
    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: dist.ReduceScatterOptions | None = None) -> dist.Work:
        output = self._one_tensor(output_tensors, "reduce_scatter output")
        if len(input_lists) != 1:
            raise ValueError(f"reduce_scatter: expected one input list, got {len(input_lists)}")
        inputs = self._list_of_size(input_lists[0], "reduce_scatter input list")
        self._same_shape(inputs, output, "reduce_scatter input")
        if self._gloo is not None:
            return self._delegate("reduce_scatter", output_tensors, input_lists, opts)
        if self._size == 1:
            self._reduce_scatter_local(output, inputs[0], opts)
            return CompletedWork([output])
        stacked = torch.cat([t.reshape(-1) for t in inputs]) if output.numel() else output.reshape(-1)
        return self._reduce_scatter_flat(output, stacked, opts, [output])

    @_route_devices
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: dist.ReduceScatterOptions | None = None) -> dist.Work:
        _check_tensor(output, "reduce_scatter_tensor output")
        _check_tensor(input, "reduce_scatter_tensor input")
        if input.dtype != output.dtype or input.numel() != output.numel() * self._size:
            raise ValueError(f"reduce_scatter_tensor: input must be {output.dtype} with "
                             f"{output.numel() * self._size} elements (output x {self._size} ranks), got "
                             f"{input.dtype} with {input.numel()}")
        if self._flat_only("reduce_scatter_single"):
            return self._delegate("_reduce_scatter_base", output, input, opts)
        if self._size == 1:
            self._reduce_scatter_local(output, input, opts)
            return CompletedWork([output])
        # Only its data is read, so it is not flattened (reshape costs a microsecond).
        return self._reduce_scatter_flat(output, input if input.is_contiguous() else input.contiguous(), opts,
                                         [output])

    _reduce_scatter_base = reduce_scatter_single

    def _reduce_scatter_local(self, output, input, opts) -> None:
        redop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        op, _, _, scale, _ = self._reduction(redop, output, "reduce_scatter")
        output.copy_(input.reshape(output.shape))
        if scale != 1.0 and not op.average:
            output.mul_(scale)

    def _reduce_scatter_flat(self, output, flat_input, opts, result):
        """``flat_input``: a contiguous tensor of L x output's elements (any shape)."""
        redop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        op, dtype, kernel, scale, out_view = self._reduction(redop, output, "reduce_scatter")
        if flat_input.is_complex():
            flat_input = torch.view_as_real(flat_input)
        count = out_view.numel()
        if count == 0:
            return CompletedWork(result)
        if self._hierarchy is not None:
            return self._across_nodes("reduce_scatter_single",
                                      ops.descriptor(ops.REDUCE_SCATTER, count, dtype.code, op.code), result, opts,
                                      out_view, flat_input, op, dtype, kernel, scale)
        itemsize = out_view.element_size()

        def body():
            staged = _staged(out_view)
            _reduce_scatter.reduce_scatter(self._arena, flat_input.data_ptr(), count, itemsize, kernel, op.kernel,
                                           scale, staged.data_ptr(), self._desc)
            _unstage(out_view, staged)

        return self._launch(ops.descriptor(ops.REDUCE_SCATTER, count, dtype.code, op.code), body, result, opts)

    @_route_devices
    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: dist.ReduceScatterOptions | None = None) -> dist.Work:
        if len(outputs) != len(inputs):
            raise ValueError(f"reduce_scatter_tensor_coalesced: {len(outputs)} outputs for {len(inputs)} inputs")
        sync = _sync_options(dist.ReduceScatterOptions, opts)
        for output, input in zip(outputs, inputs):
            self.reduce_scatter_single(output, input, sync)
        return CompletedWork(list(outputs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # -- data movement -------------------------------------------------------

    @_route_devices
    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions | None = None) -> dist.Work:
        tensor = self._one_tensor(tensors, "broadcast")
        root = self._root(opts.rootRank if opts is not None else 0, "broadcast")
        if self._flat_only("broadcast"):
            return self._delegate("broadcast", [tensor], opts)
        nbytes = _nbytes(tensor)
        if self._size == 1:
            return CompletedWork([tensor])
        desc = ops.descriptor(ops.BROADCAST, *_movement(tensor), 0, root)
        if nbytes == 0:
            return self._empty(desc, [tensor], opts)
        if self._hierarchy is not None:
            return self._across_nodes("broadcast", desc, [tensor], opts, tensor, root)

        def body():
            work = _staged(tensor)
            _broadcast.broadcast(self._arena, work.data_ptr(), nbytes, root, self._desc)
            _unstage(tensor, work)

        return self._launch(desc, body, [tensor], opts)

    @_route_devices
    def allgather(self, output_lists: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: AllgatherOptions | None = None) -> dist.Work:
        tensor = self._one_tensor(input_tensors, "all_gather")
        if len(output_lists) != 1:
            raise ValueError(f"all_gather: expected one output list, got {len(output_lists)}")
        outputs = self._list_of_size(output_lists[0], "all_gather output list")
        self._same_shape(outputs, tensor, "all_gather output")
        if self._gloo is not None:
            return self._delegate("allgather", output_lists, [tensor], opts)
        if self._size == 1:
            outputs[0].copy_(tensor)
            return CompletedWork(output_lists)
        nbytes = _nbytes(tensor)
        desc = ops.descriptor(ops.ALLGATHER, *_movement(tensor))
        if nbytes == 0:
            return self._empty(desc, output_lists, opts)

        def body():
            source = tensor.contiguous()
            targets = [_staged_empty(out) for out in outputs]
            _allgather.allgather(self._arena, source.data_ptr(), nbytes, [t.data_ptr() for t in targets],
                                 self._desc)
            for out, target in zip(outputs, targets):
                _unstage(out, target)

        return self._launch(desc, body, output_lists, opts)

    @_route_devices
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: AllgatherOptions | None = None) -> dist.Work:
        _check_tensor(input, "all_gather_into_tensor input")
        _check_tensor(output, "all_gather_into_tensor output")
        if output.dtype != input.dtype or output.numel() != input.numel() * self._size:
            raise ValueError(f"all_gather_into_tensor: output must be {input.dtype} with "
                             f"{input.numel() * self._size} elements (input x {self._size} ranks), got "
                             f"{output.dtype} with {output.numel()}")
        if self._flat_only("all_gather_single"):
            return self._delegate("_allgather_base", output, input, opts)
        if self._size == 1:
            output.view(-1).copy_(input.reshape(-1))
            return CompletedWork([output])
        nbytes = _nbytes(input)
        desc = ops.descriptor(ops.ALLGATHER, *_movement(input))
        if nbytes == 0:
            return self._empty(desc, [output], opts)
        if self._hierarchy is not None:
            return self._across_nodes("all_gather_single", desc, [output], opts, output, input)

        def body():
            source = input.contiguous()
            target = _staged_empty(output)
            _allgather.allgather(self._arena, source.data_ptr(), nbytes, (target.data_ptr(), nbytes), self._desc)
            _unstage(output, target)

        return self._launch(desc, body, [output], opts)

    _allgather_base = all_gather_single

    @_route_devices
    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                            opts: AllgatherOptions | None = None) -> dist.Work:
        if len(output_lists) != len(input_list):
            raise ValueError(f"all_gather_coalesced: {len(output_lists)} output lists for {len(input_list)} inputs")
        sync = _sync_options(None, opts)
        for outputs, tensor in zip(output_lists, input_list):
            self.allgather([outputs], [tensor], sync)
        return CompletedWork(output_lists)

    @_route_devices
    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: AllgatherOptions | None = None) -> dist.Work:
        if len(outputs) != len(inputs):
            raise ValueError(f"all_gather_into_tensor_coalesced: {len(outputs)} outputs for {len(inputs)} inputs")
        sync = _sync_options(None, opts)
        for output, input in zip(outputs, inputs):
            self.all_gather_single(output, input, sync)
        return CompletedWork(list(outputs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    @_route_devices
    def gather(self, output_lists: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: dist.GatherOptions | None = None) -> dist.Work:
        tensor = self._one_tensor(input_tensors, "gather")
        root = self._root(opts.rootRank if opts is not None else 0, "gather")
        if self._rank == root:
            if len(output_lists) != 1:
                raise ValueError(f"gather: the root expects one output list, got {len(output_lists)}")
            outputs = self._list_of_size(output_lists[0], "gather output list")
            self._same_shape(outputs, tensor, "gather output")
        elif output_lists and any(len(lst) for lst in output_lists):
            raise ValueError(f"gather: only the root (rank {root}) takes output tensors; rank {self._rank} got some")
        if self._gloo is not None:
            return self._delegate("gather", output_lists, [tensor], opts)
        if self._size == 1:
            output_lists[0][0].copy_(tensor)
            return CompletedWork(output_lists)
        nbytes = _nbytes(tensor)
        if nbytes == 0:
            return CompletedWork(output_lists)

        def body():
            source = tensor.contiguous()
            targets = [_staged_empty(out) for out in output_lists[0]] if self._rank == root else []
            _gather.gather(self._arena, source.data_ptr(), nbytes, root, [t.data_ptr() for t in targets], self._desc)
            if targets:
                for out, target in zip(output_lists[0], targets):
                    _unstage(out, target)

        return self._launch(ops.descriptor(ops.GATHER, nbytes, 0, 0, root), body, output_lists, opts)

    @_route_devices
    def scatter(self, output_tensors: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                opts: dist.ScatterOptions | None = None) -> dist.Work:
        output = self._one_tensor(output_tensors, "scatter output")
        root = self._root(opts.rootRank if opts is not None else 0, "scatter")
        if self._rank == root:
            if len(input_lists) != 1:
                raise ValueError(f"scatter: the root expects one input list, got {len(input_lists)}")
            inputs = self._list_of_size(input_lists[0], "scatter input list")
            self._same_shape(inputs, output, "scatter input")
        elif input_lists and any(len(lst) for lst in input_lists):
            raise ValueError(f"scatter: only the root (rank {root}) takes input tensors; rank {self._rank} got some")
        if self._gloo is not None:
            return self._delegate("scatter", output_tensors, input_lists, opts)
        if self._size == 1:
            output.copy_(input_lists[0][0])
            return CompletedWork([output])
        nbytes = _nbytes(output)
        if nbytes == 0:
            return CompletedWork([output])

        def body():
            sources = [t.contiguous() for t in input_lists[0]] if self._rank == root else []
            target = _staged_empty(output)
            _scatter.scatter(self._arena, [t.data_ptr() for t in sources], nbytes, root, target.data_ptr(),
                             self._desc)
            _unstage(output, target)

        return self._launch(ops.descriptor(ops.SCATTER, nbytes, 0, 0, root), body, [output], opts)

    @_route_devices
    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: dist.AllToAllOptions | None = None) -> dist.Work:
        outputs = self._list_of_size(output_tensors, "all_to_all output list")
        inputs = self._list_of_size(input_tensors, "all_to_all input list")
        for i, t in enumerate(inputs):
            _check_tensor(t, f"all_to_all input[{i}]")
        for i, t in enumerate(outputs):
            _check_tensor(t, f"all_to_all output[{i}]")
            if t.dtype != inputs[0].dtype:
                raise ValueError(f"all_to_all: output[{i}] is {t.dtype}, the inputs are {inputs[0].dtype}")
        if self._gloo is not None:
            return self._delegate("alltoall", output_tensors, input_tensors, opts)
        sizes_in = [_nbytes(t) for t in inputs]
        sizes_out = [_nbytes(t) for t in outputs]
        uniform = len(set(sizes_in + sizes_out)) == 1
        if self._size == 1:
            outputs[0].copy_(inputs[0].reshape(outputs[0].shape))
            return CompletedWork(output_tensors)

        def body():
            sources = [t.contiguous() for t in inputs]
            targets = [_staged_empty(t) for t in outputs]
            _alltoall.alltoall(self._arena, [(t.data_ptr(), n) for t, n in zip(sources, sizes_in)],
                               [(t.data_ptr(), n) for t, n in zip(targets, sizes_out)], self._desc, uniform)
            for out, target in zip(outputs, targets):
                _unstage(out, target)

        return self._launch(ops.descriptor(ops.ALLTOALL, sizes_in[0] if uniform else 0), body, output_tensors, opts)

    @_route_devices
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: dist.AllToAllOptions | None = None) -> dist.Work:
        _check_tensor(input, "all_to_all_single input")
        _check_tensor(output, "all_to_all_single output")
        if output.dtype != input.dtype:
            raise ValueError(f"all_to_all_single: output is {output.dtype}, input is {input.dtype}")
        if self._gloo is not None:
            return self._delegate("alltoall_base", output, input, output_split_sizes, input_split_sizes, opts)
        send = _split_bytes(input, list(input_split_sizes), self._size, "input")
        recv = _split_bytes(output, list(output_split_sizes), self._size, "output")
        uniform = not input_split_sizes and not output_split_sizes
        if self._size == 1:
            output.copy_(input)
            return CompletedWork([output])

        def body():
            source = input.contiguous()
            target = _staged_empty(output)
            base_in, base_out = source.data_ptr(), target.data_ptr()
            _alltoall.alltoall(self._arena, [(base_in + off, n) for off, n in send],
                               [(base_out + off, n) for off, n in recv], self._desc, uniform)
            _unstage(output, target)

        return self._launch(ops.descriptor(ops.ALLTOALL, send[0][1] if uniform else 0), body, [output], opts)

    all_to_all_single = alltoall_base

    def barrier(self, opts: dist.BarrierOptions | None = None) -> dist.Work:
        if self._size == 1:
            return CompletedWork()
        if not isinstance(opts, dist.BarrierOptions):
            opts = None  # barrier(timeout=...) overload
        if self._hierarchy is not None:
            return self._across_nodes("barrier", ops.descriptor(ops.BARRIER), [], opts)

        def body():
            _barrier.barrier(self._arena, self._desc)

        return self._launch(ops.descriptor(ops.BARRIER), body, [], opts)

    # -- point-to-point ------------------------------------------------------

    def _peer(self, peer: int, what: str) -> int:
        self._check_usable()  # like every collective: after an error, peers may be anywhere
        if not 0 <= peer < self._size:
            raise ValueError(f"{what}: rank {peer} is not in this group of {self._size} ranks")
        if peer == self._rank:
            raise ValueError(f"{what}: rank {peer} cannot exchange a message with itself")
        return peer

    @_route_devices
    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int = 0) -> dist.Work:
        tensor = self._one_tensor(tensors, "send")
        dst = self._peer(dstRank, "send")
        if self._gloo is not None:
            return self._gloo.send([tensor], dst, tag)
        source = tensor.contiguous()
        return self._p2p.start(Send(self._p2p, dst, source.data_ptr(), _nbytes(source), tag, [source]))

    @_route_devices
    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int = 0) -> dist.Work:
        tensor = self._one_tensor(tensors, "recv")
        src = self._peer(srcRank, "recv")
        if self._gloo is not None:
            return self._gloo.recv([tensor], src, tag)
        return self._start_recv(tensor, src, tag)

    @_route_devices
    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> dist.Work:
        tensor = self._one_tensor(tensors, "recv")
        self._check_usable()
        if self._gloo is not None:
            return self._gloo.recv_anysource([tensor], tag)
        if self._size == 1:
            raise ValueError("recv from any source in a group of one rank would never complete")
        return self._start_recv(tensor, None, tag)

    def _start_recv(self, tensor, src, tag):
        if not tensor.is_contiguous():
            raise ValueError("recv: the shm backend receives into contiguous tensors only; "
                             "pass tensor.contiguous() and copy it back")
        return self._p2p.start(Recv(self._p2p, src, tensor.data_ptr(), _nbytes(tensor), tag, [tensor]))

    # -- teardown ------------------------------------------------------------

    def shutdown(self) -> None:
        """Finish queued work, stop the progress thread and release the arena mapping."""
        self._engine.close()
        if self._p2p is not None:
            self._p2p.close()
            self._p2p = None
        if self._arena is not None:
            self._arena.close()
            self._arena = None
        if self._hierarchy is not None:
            self._hierarchy.close()
            self._gloo = None
        self._error = self._error or ShmcollError("this shm process group was shut down")

    def abort(self) -> None:
        self.shutdown()


def _movement(tensor) -> tuple[int, int]:
    """(count, dtype code) of a data-movement descriptor: elements of a named dtype, else bytes."""
    code = ops.movement_code(tensor.dtype)
    return (tensor.numel(), code) if code else (_nbytes(tensor), 0)


def _sync_options(options_type, opts):
    """Options for the per-tensor calls of a coalesced op: synchronous, same reduce op."""
    inner = options_type() if options_type is not None else None
    if inner is None:
        from torch._C._distributed_c10d import AllgatherOptions

        inner = AllgatherOptions()
    if opts is not None and hasattr(opts, "reduceOp") and hasattr(inner, "reduceOp"):
        inner.reduceOp = opts.reduceOp
    inner.asyncOp = False
    return inner


def _split_bytes(tensor, splits: list[int], size: int, what: str) -> list[tuple[int, int]]:
    """(byte offset, byte count) of each rank's block along dim 0."""
    rows = tensor.shape[0] if tensor.dim() else 1
    row_bytes = _nbytes(tensor) // rows if rows else 0
    if not splits:
        if rows % size:
            raise ValueError(f"all_to_all_single: {what} has {rows} rows, not divisible by the {size} ranks; "
                             f"pass split sizes")
        splits = [rows // size] * size
    if len(splits) != size or sum(splits) != rows or min(splits) < 0:
        raise ValueError(f"all_to_all_single: {what} split sizes {splits} must be {size} non-negative numbers "
                         f"summing to its {rows} rows")
    blocks, offset = [], 0
    for n in splits:
        blocks.append((offset, n * row_bytes))
        offset += n * row_bytes
    return blocks
