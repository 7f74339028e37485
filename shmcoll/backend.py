"""ProcessGroupShm: the torch.distributed surface of the shm backend.

Every method opens the same way: check the arguments, take the single-rank
shortcut, then hand raw addresses to one algorithm in ``shmcoll.algorithms``.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from shmcoll import kernels, ops, topology
from shmcoll._env import read_settings
from shmcoll.algorithms import allgather as _allgather
from shmcoll.algorithms import allreduce as _allreduce
from shmcoll.algorithms import barrier as _barrier
from shmcoll.algorithms import broadcast as _broadcast
from shmcoll.arena import open_arena
from shmcoll.errors import ShmcollError
from shmcoll.work import CompletedWork


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
        self._gloo = None
        self._seq = 0  # collectives issued on this group, for messages
        self._desc = 0  # descriptor of the collective in progress
        self._reducers: dict[str, object] = {}
        # Load every kernel before any collective, so none compiles on only some ranks.
        kernels.warm()
        if size == 1:
            return
        topo = topology.discover(store, rank, size, topology.host_identity(self._settings.hostid))
        if topo.single_node:
            spin_ns, yield_ns = _wait_policy(self._settings, size)
            self._arena = open_arena(store, rank, size, list(range(size)), self._settings, timeout,
                                     spin_ns, yield_ns)
            self._arena._describe = self._describe_step
        else:
            # Several nodes: correct through Gloo until the hierarchical plans land.
            self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)

    # -- torch.distributed hooks ---------------------------------------------

    def getBackendName(self) -> str:
        return "shm"

    @property
    def options(self):
        return None

    # -- helpers -------------------------------------------------------------

    def _describe_step(self, step: int) -> str:
        return f"{ops.describe_desc(self._desc)} #{self._seq}"

    def _begin(self, desc: int) -> None:
        if self._error is not None:
            raise ShmcollError(f"this shm process group is unusable after an earlier error: {self._error}")
        self._seq += 1
        self._desc = desc

    def _fail(self, error: BaseException) -> None:
        self._error = error

    @staticmethod
    def _check_tensor(tensor, what: str) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cpu":
            raise ValueError(f"{what}: the shm backend handles CPU tensors only, got a tensor on {tensor.device}; "
                             f"use init_process_group('cpu:shm,cuda:nccl') to route device tensors elsewhere")
        if tensor.layout != torch.strided:
            raise ValueError(f"{what}: the shm backend handles dense tensors only, got layout {tensor.layout}")

    def _one_tensor(self, tensors, what: str) -> torch.Tensor:
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if len(tensors) != 1:
            raise ValueError(f"{what}: the shm backend takes exactly one tensor per call, got {len(tensors)}")
        tensor = tensors[0]
        self._check_tensor(tensor, what)
        return tensor

    def _reducer(self, dtype: ops.DType):
        kernel = self._reducers.get(dtype.name)
        if kernel is None:
            kernel = self._reducers[dtype.name] = kernels.reducer(dtype.name)
        return kernel

    # -- collectives ---------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        tensor = self._one_tensor(tensors, "all_reduce")
        op, dtype = ops.reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, tensor.dtype)
        if self._gloo is not None:
            return self._gloo.allreduce([tensor], opts)
        count = tensor.numel()
        if self._size == 1 or count == 0:
            return CompletedWork([tensor])
        self._begin(ops.descriptor(ops.ALLREDUCE, count, dtype.code, op.code))
        work = tensor if tensor.is_contiguous() else tensor.contiguous()
        itemsize = work.element_size()
        scale = float(self._size) if op.average else 1.0
        arena = self._arena
        plan = (_allreduce.one_shot
                if count * itemsize <= min(self._settings.small_bytes, arena.chunk_bytes)
                else _allreduce.reduce_scatter_allgather)
        try:
            plan(arena, work.data_ptr(), count, itemsize, dtype.numpy, self._reducer(dtype), op.kernel, scale,
                 self._desc)
        except ShmcollError as error:
            self._fail(error)
            raise
        if work is not tensor:
            tensor.copy_(work)
        return CompletedWork([tensor])

    def broadcast(self, tensors, opts=None):
        tensor = self._one_tensor(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        if not 0 <= root < self._size:
            raise ValueError(f"broadcast: root rank {root} is not in this group of {self._size} ranks")
        if self._gloo is not None:
            return self._gloo.broadcast([tensor], opts)
        nbytes = tensor.numel() * tensor.element_size()
        if self._size == 1 or nbytes == 0:
            return CompletedWork([tensor])
        self._begin(ops.descriptor(ops.BROADCAST, nbytes, 0, 0, root))
        work = tensor if tensor.is_contiguous() else tensor.contiguous()
        try:
            _broadcast.broadcast(self._arena, work.data_ptr(), nbytes, root, self._desc)
        except ShmcollError as error:
            self._fail(error)
            raise
        if work is not tensor:
            tensor.copy_(work)
        return CompletedWork([tensor])

    def allgather(self, output_tensors, input_tensors, opts=None):
        tensor = self._one_tensor(input_tensors, "all_gather")
        if len(output_tensors) != 1:
            raise ValueError(f"all_gather: expected one output list, got {len(output_tensors)}")
        outputs = output_tensors[0]
        if len(outputs) != self._size:
            raise ValueError(f"all_gather: the output list has {len(outputs)} tensors, "
                             f"the group has {self._size} ranks")
        for i, out in enumerate(outputs):
            self._check_tensor(out, f"all_gather output[{i}]")
            if out.dtype != tensor.dtype or out.numel() != tensor.numel():
                raise ValueError(f"all_gather: output[{i}] is {out.dtype} with {out.numel()} elements, "
                                 f"the input is {tensor.dtype} with {tensor.numel()} elements")
        if self._gloo is not None:
            return self._gloo.allgather(output_tensors, [tensor], opts)
        if self._size == 1:
            outputs[0].copy_(tensor)
            return CompletedWork(output_tensors)
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes == 0:
            return CompletedWork(output_tensors)
        self._begin(ops.descriptor(ops.ALLGATHER, nbytes))
        source = tensor.contiguous()
        targets = [out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
                   for out in outputs]
        try:
            _allgather.allgather(self._arena, source.data_ptr(), nbytes, [t.data_ptr() for t in targets],
                                 self._desc)
        except ShmcollError as error:
            self._fail(error)
            raise
        for out, target in zip(outputs, targets):
            if out is not target:
                out.copy_(target)
        return CompletedWork(output_tensors)

    def all_gather_single(self, output, input, opts=None):
        self._check_tensor(input, "all_gather_into_tensor input")
        self._check_tensor(output, "all_gather_into_tensor output")
        if output.dtype != input.dtype or output.numel() != input.numel() * self._size:
            raise ValueError(f"all_gather_into_tensor: output must be {input.dtype} with "
                             f"{input.numel() * self._size} elements (input x {self._size} ranks), got "
                             f"{output.dtype} with {output.numel()}")
        if self._gloo is not None:
            return self._gloo._allgather_base(output, input, opts)
        nbytes = input.numel() * input.element_size()
        if self._size == 1:
            output.view(-1).copy_(input.reshape(-1))
            return CompletedWork([output])
        if nbytes == 0:
            return CompletedWork([output])
        self._begin(ops.descriptor(ops.ALLGATHER, nbytes))
        source = input.contiguous()
        target = output if output.is_contiguous() else torch.empty_like(output,
                                                                        memory_format=torch.contiguous_format)
        try:
            _allgather.allgather(self._arena, source.data_ptr(), nbytes, (target.data_ptr(), nbytes), self._desc)
        except ShmcollError as error:
            self._fail(error)
            raise
        if target is not output:
            output.copy_(target)
        return CompletedWork([output])

    _allgather_base = all_gather_single

    def barrier(self, opts=None):
        if self._gloo is not None:
            return self._gloo.barrier(opts) if opts is not None else self._gloo.barrier()
        if self._size == 1:
            return CompletedWork()
        self._begin(ops.descriptor(ops.BARRIER))
        try:
            _barrier.barrier(self._arena, self._desc)
        except ShmcollError as error:
            self._fail(error)
            raise
        return CompletedWork()

    # -- teardown ------------------------------------------------------------

    def shutdown(self) -> None:
        """Release the arena mapping; the segment's name was unlinked at creation."""
        if self._arena is not None:
            self._arena.close()
            self._arena = None
        self._error = self._error or ShmcollError("this shm process group was shut down")

    def abort(self) -> None:
        self.shutdown()
