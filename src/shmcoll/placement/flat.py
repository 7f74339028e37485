"""Collectives over one Gloo group of all ranks: what runs across nodes when no hierarchical plan does.

Correct first: every call waits for Gloo before returning (the backend's
progress engine provides asynchrony and issue order). Reductions map to what
Gloo computes (``gloo_op``): AVG is Gloo's SUM divided afterwards, PREMUL_SUM
multiplies the input by its factor first; complex tensors travel as their real
view; non-contiguous tensors through a contiguous stand-in.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from shmcoll import ops
from shmcoll._torch_compat import AllgatherOptions
from shmcoll.staging import staged, staged_empty, unstage

# Our op (shmcoll.ops name) -> the ReduceOp Gloo applies to the partial results.
_GLOO_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
             "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
             "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}


def gloo_op(red: ops.Reduction):
    return _GLOO_OPS[red.op.name]


def finish_average(tensor: torch.Tensor, size: int) -> None:
    """SUM -> mean over ``size`` ranks, rounded once (as Gloo and the arena kernels do)."""
    if tensor.dtype in (torch.float16, torch.bfloat16):
        tensor.copy_(tensor.float().div_(size))
    else:
        tensor.div_(size)


def _premultiplied(work: torch.Tensor, red: ops.Reduction) -> torch.Tensor:
    """What this rank contributes to Gloo's reduction: the input, times PREMUL_SUM's factor."""
    if red.scale != 1.0 and not red.op.average:
        return work * red.scale
    return work


class Flat:
    """Every collective of the backend's surface, on one Gloo group over all ranks."""

    def __init__(self, group, rank: int, size: int):
        self.group = group
        self.rank = rank
        self.size = size

    def _finish(self, work: torch.Tensor, red: ops.Reduction) -> None:
        if red.op.average:
            finish_average(work, self.size)

    def allreduce(self, tensor: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        flat = red.view(tensor)
        work = staged(flat)
        data = _premultiplied(work, red)
        opts = dist.AllreduceOptions()
        opts.reduceOp = gloo_op(red)
        self.group.allreduce([data], opts).wait()
        if data is not work:
            work.copy_(data)
        self._finish(work, red)
        unstage(flat, work)

    def reduce(self, tensor: torch.Tensor, root: int, red: ops.Reduction, desc: int) -> None:
        flat = red.view(tensor)
        work = staged(flat)
        data = _premultiplied(work, red)
        if data is work and self.rank != root:
            data = work.clone()  # Gloo may use a non-root's buffer as scratch; the caller's stays as it was
        opts = dist.ReduceOptions()
        opts.reduceOp = gloo_op(red)
        opts.rootRank = root
        self.group.reduce([data], opts).wait()
        if self.rank == root:
            if data is not work:
                work.copy_(data)
            self._finish(work, red)
            unstage(flat, work)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        out = red.view(output)
        source = _premultiplied(red.view(input), red)
        target = staged_empty(out)
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = gloo_op(red)
        self.group._reduce_scatter_base(target.view(-1), source.reshape(-1), opts).wait()
        self._finish(target, red)
        unstage(out, target)

    def broadcast(self, tensor: torch.Tensor, root: int, desc: int) -> None:
        work = staged(tensor)
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        self.group.broadcast([work], opts).wait()
        unstage(tensor, work)

    def allgather(self, outputs: list[torch.Tensor], input: torch.Tensor, desc: int) -> None:
        targets = [staged_empty(out) for out in outputs]
        self.group.allgather([targets], [input.contiguous()], AllgatherOptions()).wait()
        for out, target in zip(outputs, targets):
            unstage(out, target)

    def allgather_into(self, output: torch.Tensor, input: torch.Tensor, desc: int) -> None:
        target = staged_empty(output)
        self.group._allgather_base(target.view(-1), input.contiguous().view(-1), AllgatherOptions()).wait()
        unstage(output, target)

    def gather(self, outputs: list[torch.Tensor] | None, input: torch.Tensor, root: int, desc: int) -> None:
        targets = [staged_empty(out) for out in outputs] if outputs is not None else None
        opts = dist.GatherOptions()
        opts.rootRank = root
        self.group.gather([targets] if targets is not None else [], [input.contiguous()], opts).wait()
        for out, target in zip(outputs or [], targets or []):
            unstage(out, target)

    def scatter(self, output: torch.Tensor, inputs: list[torch.Tensor] | None, root: int, desc: int) -> None:
        target = staged_empty(output)
        opts = dist.ScatterOptions()
        opts.rootRank = root
        sources = [[t.contiguous() for t in inputs]] if inputs is not None else []
        self.group.scatter([target], sources, opts).wait()
        unstage(output, target)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], desc: int) -> None:
        targets = [staged_empty(out) for out in outputs]
        self.group.alltoall(targets, [t.contiguous() for t in inputs], dist.AllToAllOptions()).wait()
        for out, target in zip(outputs, targets):
            unstage(out, target)

    def alltoall_single(self, output: torch.Tensor, input: torch.Tensor, out_blocks, in_blocks, desc: int) -> None:
        target = staged_empty(output)
        out_splits = _rows(out_blocks, output)
        in_splits = _rows(in_blocks, input)
        self.group.alltoall_base(target, input.contiguous(), out_splits, in_splits,
                                 dist.AllToAllOptions()).wait()
        unstage(output, target)

    def barrier(self, desc: int) -> None:
        self.group.barrier().wait()

    def send(self, tensor: torch.Tensor, dst: int, tag: int):
        return self.group.send([tensor.contiguous()], dst, tag)

    def recv(self, tensor: torch.Tensor, src: int | None, tag: int):
        if src is None:
            return self.group.recv_anysource([tensor], tag)
        return self.group.recv([tensor], src, tag)

    def close(self) -> None:
        """Stop Gloo's threads now, while the interpreter is whole (see placement.nodes.Nodes.close)."""
        if self.group is not None:
            self.group.shutdown()
            self.group = None


def _rows(blocks, tensor: torch.Tensor) -> list[int]:
    """Split sizes in rows from (byte offset, byte count) blocks."""
    rows = tensor.shape[0] if tensor.dim() else 1
    row_bytes = tensor.numel() * tensor.element_size() // rows if rows else 1
    return [n // row_bytes if row_bytes else 0 for _, n in blocks]
