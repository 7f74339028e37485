"""A group of one rank: every collective is a local copy (or nothing)."""
from __future__ import annotations

import torch

from shmcoll import ops


class SingleRank:
    """The group's placement when it has one rank."""

    nodes = [[0]]
    one_shot_bytes = 0  # no small all-reduce path: allreduce() is already a local operation
    async_inline = True  # no peer to wait for, nothing to overlap: every asynchronous call runs inline

    def compiled_paths(self) -> None:
        """None: one rank's collectives are local copies (no compiled small paths)."""
        return None

    def allreduce(self, tensor: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        red.local(red.view(tensor))

    def reduce(self, tensor: torch.Tensor, root: int, red: ops.Reduction, desc: int) -> None:
        red.local(red.view(tensor))

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        output.copy_(input.reshape(output.shape))
        red.local(red.view(output))

    def broadcast(self, tensor: torch.Tensor, root: int, desc: int) -> None:
        pass

    def allgather(self, outputs: list[torch.Tensor], input: torch.Tensor, desc: int) -> None:
        outputs[0].copy_(input.reshape(outputs[0].shape))

    def allgather_into(self, output: torch.Tensor, input: torch.Tensor, desc: int) -> None:
        output.copy_(input.reshape(output.shape))

    def allgather_windows(self, input: torch.Tensor, unit: int, consume, desc: int) -> None:
        source = input.contiguous()
        consume(0, source.nbytes, [source.data_ptr()])

    def gather(self, outputs: list[torch.Tensor] | None, input: torch.Tensor, root: int, desc: int) -> None:
        outputs[0].copy_(input.reshape(outputs[0].shape))

    def scatter(self, output: torch.Tensor, inputs: list[torch.Tensor] | None, root: int, desc: int) -> None:
        output.copy_(inputs[0].reshape(output.shape))

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], desc: int) -> None:
        outputs[0].copy_(inputs[0].reshape(outputs[0].shape))

    def alltoall_single(self, output: torch.Tensor, input: torch.Tensor, out_blocks, in_blocks, desc: int) -> None:
        output.copy_(input.reshape(output.shape))

    def barrier(self, desc: int) -> None:
        pass

    def send(self, tensor: torch.Tensor, dst: int, tag: int):
        raise AssertionError("unreachable: the surface refuses a peer equal to this rank")

    def recv(self, tensor: torch.Tensor, src: int | None, tag: int):
        raise ValueError("recv from any source in a group of one rank would never complete")

    def set_background(self, on: bool) -> None:
        pass

    def abort(self, why: str) -> None:
        pass  # nothing ever waits

    def abandon(self) -> None:
        pass  # no peer waits for this rank

    def close(self) -> None:
        pass

    def summary(self) -> list[str]:
        return ["  one rank: every collective is a local copy"]
