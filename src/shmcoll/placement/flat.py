"""Collectives over one Gloo group of all ranks: what runs across nodes when no hierarchical plan does.

Correct first: every call waits for Gloo before returning (the backend's
progress engine provides asynchrony and issue order). Reductions map to what
Gloo computes (``Op.gloo``): AVG is Gloo's SUM divided afterwards, PREMUL_SUM
multiplies the input by its factor first; complex tensors travel as their real
view; non-contiguous tensors through a contiguous stand-in.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from shmcoll import ops
from shmcoll._torch_compat import AllgatherOptions
from shmcoll.staging import staged, staged_empty, unstage

def _premultiplied(work: torch.Tensor, red: ops.Reduction) -> torch.Tensor:
    """What this rank contributes to Gloo's reduction: the input, times PREMUL_SUM's factor."""
    if red.scale != 1.0 and not red.op.average:
        return work * red.scale
    return work


# Tags on the group: a user's point-to-point message with tag t travels with tag 2t, the plans' own
# messages (``placement.across``, ``Shape.pairs``) with PLAN_TAG, odd, so that neither can match the other.
PLAN_TAG = 1
_USER_TAGS = 1 << 30


def _user_tag(tag: int) -> int:
    if not 0 <= tag < _USER_TAGS:
        raise ValueError(f"the shm backend takes point-to-point tags from 0 to {_USER_TAGS - 1} between nodes, "
                         f"got {tag}")
    return 2 * tag


class Flat:
    """Every collective of the backend's surface, on one Gloo group over all ranks."""

    def __init__(self, group, rank: int, size: int):
        self.group = group
        self.rank = rank
        self.size = size

    def allreduce(self, tensor: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        flat = red.view(tensor)
        work = staged(flat)
        data = _premultiplied(work, red)
        opts = dist.AllreduceOptions()
        opts.reduceOp = red.op.gloo
        self.group.allreduce([data], opts).wait()
        if data is not work:
            work.copy_(data)
        red.average(work)
        unstage(flat, work)

    def reduce(self, tensor: torch.Tensor, root: int, red: ops.Reduction, desc: int) -> None:
        flat = red.view(tensor)
        work = staged(flat)
        data = _premultiplied(work, red)
        if data is work and self.rank != root:
            data = work.clone()  # Gloo may use a non-root's buffer as scratch; the caller's stays as it was
        opts = dist.ReduceOptions()
        opts.reduceOp = red.op.gloo
        opts.rootRank = root
        self.group.reduce([data], opts).wait()
        if self.rank == root:
            if data is not work:
                work.copy_(data)
            red.average(work)
            unstage(flat, work)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        out = red.view(output)
        source = _premultiplied(red.view(input), red)
        target = staged_empty(out)
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = red.op.gloo
        self.group._reduce_scatter_base(target.view(-1), source.reshape(-1), opts).wait()
        red.average(target)
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
        # As one all_to_all_single of bytes: Gloo's list form refuses tensors of different sizes.
        source = torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in inputs])
        target = torch.empty(sum(t.nbytes for t in outputs), dtype=torch.uint8)
        self.group.alltoall_base(target, source, [t.nbytes for t in outputs], [t.nbytes for t in inputs],
                                 dist.AllToAllOptions()).wait()
        offset = 0
        for out in outputs:
            n = out.nbytes
            out.copy_(target[offset:offset + n].view(out.dtype).view(out.shape))
            offset += n

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
        return self.group.send([tensor.contiguous()], dst, _user_tag(tag))

    def recv(self, tensor: torch.Tensor, src: int | None, tag: int):
        if src is None:
            return self.group.recv_anysource([tensor], _user_tag(tag))
        return self.group.recv([tensor], src, _user_tag(tag))

    def drop(self) -> None:
        """Let go of the group without waiting (after a failure: its peers then see it close)."""
        self.group = None

    def close(self) -> None:
        """Stop Gloo's threads now, while the interpreter is whole (see placement.nodes.Nodes.close)."""
        if self.group is not None:
            self.group.shutdown()
            self.group = None


def _rows(blocks, tensor: torch.Tensor) -> list[int]:
    """Split sizes in rows from (byte offset, byte count) blocks."""
    rows = tensor.shape[0] if tensor.dim() else 1
    row_bytes = tensor.nbytes // rows if rows else 1
    return [n // row_bytes if row_bytes else 0 for _, n in blocks]
