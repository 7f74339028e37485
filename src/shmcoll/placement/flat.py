"""Collectives over one Gloo group of all ranks: what runs across nodes when no hierarchical plan does.

Correct first: every call waits for Gloo before returning (the backend's
progress engine provides asynchrony and issue order); non-contiguous tensors go
through a contiguous stand-in. Gloo only moves bytes here (``as_bytes``): a
reduce-scatter is its all_to_all of the blocks, combined by the arena's kernels
in rank order (``partials.combine``), so that every dtype and (op, dtype) works
as it does inside a node.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from shmcoll import ops
from shmcoll._torch_compat import AllgatherOptions
from shmcoll.placement.across.network import as_bytes
from shmcoll.placement.across.partials import combine
from shmcoll.staging import staged, staged_empty, unstage


# Tags on the group: a user's point-to-point message with tag t travels with tag 2t, the plans' own
# messages (``placement.across``, ``Links.pairs``) with PLAN_TAG, odd, so that neither can match the other.
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

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        """``input``: contiguous, every rank's block for ``output`` in rank order."""
        out = red.view(output)
        count = out.numel()
        if count == 0:  # still a collective, as on one node: the ranks meet
            return self.group.barrier().wait()
        rows = torch.empty((self.size, count), dtype=out.dtype)  # every rank's block for this rank
        block = count * out.element_size()
        self.group.alltoall_base(as_bytes(rows), as_bytes(red.view(input)), [block] * self.size,
                                 [block] * self.size, dist.AllToAllOptions()).wait()
        target = staged_empty(out)
        _, scale = red.across  # the inputs themselves: PREMUL_SUM's factor applies here
        combine(red, target.view(-1), rows, scale)
        red.average(target)
        unstage(out, target)

    def broadcast(self, tensor: torch.Tensor, root: int, desc: int) -> None:
        work = staged(tensor)
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        self.group.broadcast([as_bytes(work)], opts).wait()
        unstage(tensor, work)

    def allgather(self, outputs: list[torch.Tensor], input: torch.Tensor, desc: int) -> None:
        targets = [staged_empty(out) for out in outputs]
        self.group.allgather([[as_bytes(t) for t in targets]], [as_bytes(input.contiguous())],
                             AllgatherOptions()).wait()
        for out, target in zip(outputs, targets):
            unstage(out, target)

    def allgather_into(self, output: torch.Tensor, input: torch.Tensor, desc: int) -> None:
        target = staged_empty(output)
        self.group._allgather_base(as_bytes(target), as_bytes(input.contiguous()), AllgatherOptions()).wait()
        unstage(output, target)

    def gather(self, outputs: list[torch.Tensor] | None, input: torch.Tensor, root: int, desc: int) -> None:
        targets = [staged_empty(out) for out in outputs] if outputs is not None else None
        opts = dist.GatherOptions()
        opts.rootRank = root
        self.group.gather([[as_bytes(t) for t in targets]] if targets is not None else [],
                          [as_bytes(input.contiguous())], opts).wait()
        for out, target in zip(outputs or [], targets or []):
            unstage(out, target)

    def scatter(self, output: torch.Tensor, inputs: list[torch.Tensor] | None, root: int, desc: int) -> None:
        target = staged_empty(output)
        opts = dist.ScatterOptions()
        opts.rootRank = root
        sources = [[as_bytes(t.contiguous()) for t in inputs]] if inputs is not None else []
        self.group.scatter([as_bytes(target)], sources, opts).wait()
        unstage(output, target)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], desc: int) -> None:
        # As one all_to_all_single of bytes: Gloo's list form refuses tensors of different sizes.
        source = torch.cat([as_bytes(t.contiguous()) for t in inputs])
        target = torch.empty(sum(t.nbytes for t in outputs), dtype=torch.uint8)
        self.group.alltoall_base(target, source, [t.nbytes for t in outputs], [t.nbytes for t in inputs],
                                 dist.AllToAllOptions()).wait()
        offset = 0
        for out in outputs:
            n = out.nbytes
            out.copy_(target[offset:offset + n].view(out.dtype).view(out.shape))
            offset += n

    def alltoall_single(self, output: torch.Tensor, input: torch.Tensor, out_blocks, in_blocks, desc: int) -> None:
        """``out_blocks``/``in_blocks``: (byte offset, byte count) of each rank's block."""
        target = staged_empty(output)
        self.group.alltoall_base(as_bytes(target), as_bytes(input.contiguous()), [n for _, n in out_blocks],
                                 [n for _, n in in_blocks], dist.AllToAllOptions()).wait()
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

