"""The shm group: a Python ProcessGroup subclass, on every supported torch.

(Why not a Python c10d Backend under a C++ group, as Gloo sits: docs/DESIGN.md,
"How the group meets torch".)

Three things a C++ group would give for free have to be made here:

* c10d's bindings accept several call forms per method (``pg.allreduce(t)``,
  ``pg.allreduce([t], ReduceOp.MAX)``, ``pg.broadcast(t, root)``, ...), all of
  which a Python override hides; each method below turns every form into the
  one ``Collectives`` takes, (tensors, options), as the bindings would.
* A backend registered for cpu beneath the group (``fail_loud_backend``), so
  that torch code looking beneath the group finds one.
* Non-CPU tensors go to the group's backend for their device, if one is
  registered beneath it; else they raise, naming the way that works, a group
  of their own. torch registers none itself: from a list such as
  ``init_process_group("cpu:shm,cuda:nccl")`` it keeps the first creator's
  result that is a whole ProcessGroup, this one, and drops the others.

Every method is also kept out of TorchDynamo (``_torch_compat.skip_dynamo``).
"""
from __future__ import annotations

import functools
from datetime import timedelta

import torch
import torch.distributed as dist

from shmcoll import _torch_compat, checks, staging
from shmcoll.collectives import Collectives
from shmcoll.work import AsyncWork, CompletedWork, ProgressEngine, WritingBack

_CPU = torch.device("cpu")


def _options(options_type, timeout=None, **fields):
    opts = options_type()
    for name, value in fields.items():
        setattr(opts, name, value)
    if timeout is not None:
        opts.timeout = timeout
    return opts


def _listed(tensors):
    return [tensors] if isinstance(tensors, torch.Tensor) else tensors


def _one_pair(outputs, inputs):
    """(output, input) of a coalesced call of one pair, else None."""
    if type(outputs) is list and type(inputs) is list and len(outputs) == 1 == len(inputs):
        return outputs[0], inputs[0]
    return None


def _first_tensor(args):
    """The first tensor in a call's arguments (tensors, lists, or lists of lists)."""
    for arg in args:
        while isinstance(arg, (list, tuple)) and arg:
            arg = arg[0]
        if isinstance(arg, torch.Tensor):
            return arg
    return None


def _general_path(method=None, *, name: str | None = None, writes: int | None = 0):
    """A c10d method's way into ``Collectives``, for the calls the compiled paths do not take.

    Calls on non-CPU tensors go to the group's backend for that device (its method ``name``, by default the
    decorated one's). Tensors whose memory holds other values than torch shows (lazily negated or conjugated
    views, ``staging.shows_other_values``) are read through copies that hold the values torch shows, and those
    of the argument at index ``writes`` (the outputs, in place or not; None: the call writes none) are copied
    back once the call is done (``WritingBack``): the algorithms read and write raw memory.
    """
    if method is None:
        return functools.partial(_general_path, name=name, writes=writes)
    name = name or method.__name__

    @functools.wraps(method)
    def general(self, *args, **kwargs):
        tensor = _first_tensor(args)
        if tensor is not None and not tensor.is_cpu:
            return self._on_device(tensor.device, name, args, kwargs)
        swapped = staging.resolved(args, writes)
        if swapped is None:
            return method(self, *args, **kwargs)
        stand_ins, write_back = swapped
        done = method(self, *stand_ins, **kwargs)
        return WritingBack(done, write_back, _listed(args[writes])) if write_back else done

    return general


class ProcessGroupShm(Collectives, dist.ProcessGroup):
    """The shm group itself, on every supported torch (why not a Backend: docs/DESIGN.md)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        dist.ProcessGroup.__init__(self, rank, size)
        self._setup(store, rank, size, timeout)
        self._register_backend(_CPU, dist.ProcessGroup.BackendType.CUSTOM,
                               _torch_compat.fail_loud_backend(rank, size))
        # As c10d's own groups do: torch 2.15 asks every new group for its default backend (to attach its
        # flight recorder), which a group without one answers with an error.
        self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)

    # torch names every group it creates (DeviceMesh, FSDP2 and functional collectives look groups up
    # by name); the base class keeps the name in the group's backends, which the one above provides.

    def _on_device(self, device, name: str, args, kwargs):
        try:
            backend = self._get_backend(device)
        except RuntimeError:
            backend = None
        if backend is None or device.type == "cpu":
            raise checks.not_cpu(name, device)
        return getattr(backend, name)(*args, **kwargs)

    # -- every call form of c10d's bindings ------------------------------------

    # all_reduce, broadcast, all_gather (both forms), reduce_scatter_tensor, reduce, gather, scatter,
    # all_to_all_single and barrier first try the compiled small collectives
    # (Collectives._compiled_small_collectives), which take the plain CPU calls of one node's arena that its C
    # schedules run, and return None for all others.

    def allreduce(self, tensors, opts=None, timeout=None):
        work = self._small.allreduce(tensors, opts)
        return self._allreduce_any(tensors, opts, timeout) if work is None else work

    @_general_path(name="allreduce")
    def _allreduce_any(self, tensors, opts=None, timeout=None):
        if type(opts) is not dist.AllreduceOptions and opts is not None:  # allreduce(tensors, op[, timeout])
            opts = _options(dist.AllreduceOptions, timeout, reduceOp=opts)
        return Collectives.allreduce(self, _listed(tensors), opts)

    @_general_path
    def allreduce_coalesced(self, tensors, opts=None):
        return Collectives.allreduce_coalesced(self, tensors, opts)

    def reduce(self, tensors, opts=None, op=dist.ReduceOp.SUM, timeout=None):
        work = self._small.reduce(tensors, opts)
        return self._reduce_any(tensors, opts, op, timeout) if work is None else work

    @_general_path(name="reduce")
    def _reduce_any(self, tensors, opts=None, op=dist.ReduceOp.SUM, timeout=None):
        if not isinstance(opts, (dist.ReduceOptions, type(None))):  # reduce(tensor, root[, op, timeout])
            opts = _options(dist.ReduceOptions, timeout, rootRank=opts, reduceOp=op)
        return Collectives.reduce(self, _listed(tensors), opts)

    def broadcast(self, tensors, opts=None, timeout=None):
        work = self._small.broadcast(tensors, opts)
        return self._broadcast_any(tensors, opts, timeout) if work is None else work

    @_general_path(name="broadcast")
    def _broadcast_any(self, tensors, opts=None, timeout=None):
        if not isinstance(opts, (dist.BroadcastOptions, type(None))):  # broadcast(tensor, root[, timeout])
            opts = _options(dist.BroadcastOptions, timeout, rootRank=opts)
        return Collectives.broadcast(self, _listed(tensors), opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        work = self._small.allgather(output_tensors, input_tensors, opts)
        return self._allgather_any(output_tensors, input_tensors, opts) if work is None else work

    @_general_path(name="allgather")
    def _allgather_any(self, output_tensors, input_tensors, opts=None):
        if isinstance(input_tensors, torch.Tensor):  # allgather(outputs, input[, timeout])
            output_tensors, input_tensors = [output_tensors], [input_tensors]
            opts = _options(_torch_compat.AllgatherOptions, opts)
        return Collectives.allgather(self, output_tensors, input_tensors, opts)

    def all_gather_single(self, output, input, opts=None):
        work = self._small.allgather_into(output, input, opts)
        return self._all_gather_single_any(output, input, opts) if work is None else work

    @_general_path(name="all_gather_single")
    def _all_gather_single_any(self, output, input, opts=None):
        return Collectives.all_gather_single(self, output, input, opts)

    _allgather_base = all_gather_single

    @_general_path
    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return Collectives.allgather_coalesced(self, output_lists, input_list, opts)

    # A functional collective (DTensor, tensor-parallel layers, compiled code) reaches the group as the coalesced
    # form of one pair, asynchronous: the compiled small collectives take it as the plain call.

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        pair = _one_pair(outputs, inputs)
        work = None if pair is None else self._small.allgather_into(*pair, opts)
        return self._allgather_into_tensor_coalesced_any(outputs, inputs, opts) if work is None else work

    @_general_path(name="allgather_into_tensor_coalesced")
    def _allgather_into_tensor_coalesced_any(self, outputs, inputs, opts=None):
        return Collectives.allgather_into_tensor_coalesced(self, outputs, inputs, opts)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def gather(self, output_tensors, input_tensors, opts=None, timeout=None):
        work = self._small.gather(output_tensors, input_tensors, opts)
        return self._gather_any(output_tensors, input_tensors, opts, timeout) if work is None else work

    @_general_path(name="gather")
    def _gather_any(self, output_tensors, input_tensors, opts=None, timeout=None):
        if isinstance(input_tensors, torch.Tensor):  # gather(outputs, input, root[, timeout])
            output_tensors, input_tensors = [output_tensors] if output_tensors else [], [input_tensors]
            opts = _options(dist.GatherOptions, timeout, rootRank=opts)
        return Collectives.gather(self, output_tensors, input_tensors, opts)

    def scatter(self, output_tensors, input_tensors, opts=None, timeout=None):
        work = self._small.scatter(output_tensors, input_tensors, opts)
        return self._scatter_any(output_tensors, input_tensors, opts, timeout) if work is None else work

    @_general_path(name="scatter")
    def _scatter_any(self, output_tensors, input_tensors, opts=None, timeout=None):
        if isinstance(output_tensors, torch.Tensor):  # scatter(output, inputs, root[, timeout])
            output_tensors, input_tensors = [output_tensors], [input_tensors] if input_tensors else []
            opts = _options(dist.ScatterOptions, timeout, rootRank=opts)
        return Collectives.scatter(self, output_tensors, input_tensors, opts)

    @_general_path
    def reduce_scatter(self, output_tensors, input_tensors, opts=None, timeout=None):
        if isinstance(output_tensors, torch.Tensor):  # reduce_scatter(output, inputs[, op, timeout])
            output_tensors, input_tensors = [output_tensors], [input_tensors]
            opts = _options(dist.ReduceScatterOptions, timeout, reduceOp=opts if opts is not None
                            else dist.ReduceOp.SUM)
        return Collectives.reduce_scatter(self, output_tensors, input_tensors, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        work = self._small.reduce_scatter(output, input, opts)
        return self._reduce_scatter_single_any(output, input, opts) if work is None else work

    @_general_path(name="reduce_scatter_single")
    def _reduce_scatter_single_any(self, output, input, opts=None):
        return Collectives.reduce_scatter_single(self, output, input, opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        pair = _one_pair(outputs, inputs)
        work = None if pair is None else self._small.reduce_scatter(*pair, opts)
        return self._reduce_scatter_tensor_coalesced_any(outputs, inputs, opts) if work is None else work

    @_general_path(name="reduce_scatter_tensor_coalesced")
    def _reduce_scatter_tensor_coalesced_any(self, outputs, inputs, opts=None):
        return Collectives.reduce_scatter_tensor_coalesced(self, outputs, inputs, opts)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def alltoall(self, output_tensors, input_tensors, opts=None):
        work = self._small.alltoall(output_tensors, input_tensors, opts)
        return self._alltoall_any(output_tensors, input_tensors, opts) if work is None else work

    @_general_path(name="alltoall")
    def _alltoall_any(self, output_tensors, input_tensors, opts=None):
        return Collectives.alltoall(self, output_tensors, input_tensors, opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        work = self._small.alltoall_single(output, input, output_split_sizes, input_split_sizes, opts)
        return (self._alltoall_base_any(output, input, output_split_sizes, input_split_sizes, opts) if work is None
                else work)

    @_general_path(name="alltoall_base")
    def _alltoall_base_any(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if isinstance(opts, timedelta):  # alltoall_base(..., timeout)
            opts = _options(dist.AllToAllOptions, opts)
        return Collectives.alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts)

    all_to_all_single = alltoall_base

    def barrier(self, opts=None):
        if isinstance(opts, timedelta):  # barrier(timeout)
            opts = _options(dist.BarrierOptions, opts)
        work = self._small.barrier(opts)
        return Collectives.barrier(self, opts) if work is None else work

    # send and recv first try the compiled small transfers (Collectives._compiled_small_transfers), which take
    # one node's plain CPU messages that move whole at once, and return None for all others.

    def send(self, tensors, dstRank: int, tag: int = 0):
        work = self._small_transfers.send(tensors, dstRank, tag)
        return self._send_any(tensors, dstRank, tag) if work is None else work

    @_general_path(name="send", writes=None)
    def _send_any(self, tensors, dstRank: int, tag: int = 0):
        return Collectives.send(self, tensors, dstRank, tag)

    def recv(self, tensors, srcRank: int, tag: int = 0):
        work = self._small_transfers.recv(tensors, srcRank, tag)
        return self._recv_any(tensors, srcRank, tag) if work is None else work

    @_general_path(name="recv")
    def _recv_any(self, tensors, srcRank: int, tag: int = 0):
        return Collectives.recv(self, tensors, srcRank, tag)

    @_general_path
    def recv_anysource(self, tensors, tag: int = 0):
        return Collectives.recv_anysource(self, tensors, tag)


# torch reaches these from compiled code (a compiled function's collective, DDP's comm hook under torch.compile,
# a functional collective's wait_tensor): Dynamo must run their methods, and what those call, as plain Python,
# where it would stop at the group's members (UnsafeScriptObjectError: the group lost). The Works and the engine
# are here too: a waiter that helps the engine runs a queued collective's closure, which Dynamo traced.
for _kept_out in (Collectives, ProcessGroupShm, CompletedWork, AsyncWork, WritingBack, ProgressEngine):
    _torch_compat.skip_dynamo(_kept_out)
del _kept_out
