"""The network stage: every Gloo call a plan across nodes makes, through one funnel.

A call starts asynchronously (Gloo runs it on its own threads, so a plan can
overlap it with a node stage) and is waited for here; a failure becomes an
InterNodeError naming this rank, the group it was on and the ranks in it, and
the plan that made it gives up for good (``placement.nodes``). ``sent`` counts
the bytes this rank handed to Gloo for other nodes (benchmarks, the netns test).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from shmcoll.errors import InterNodeError


# Up to this many members, a stage in which every member sends to every other does it with direct
# messages (N - 1 each way, all at once: one network round); beyond, with Gloo's collective.
EXCHANGE_NODES = 8


class Pending(NamedTuple):
    works: tuple  # c10d Works, all of one network stage
    what: str  # "all_reduce on rail 1 (ranks 1, 3)", for errors


class Link:
    """One Gloo group between nodes (a rail), as this rank uses it."""

    def __init__(self, rank: int, node: int, group, name: str, ranks: list[int], position: int, tag: int = 0):
        self.rank = rank
        self.tag = tag  # of our sends and receives (see ``flat.PLAN_TAG``)
        self.node = node  # this rank's, for errors
        self.group = group  # ProcessGroupGloo over ``ranks``
        self.name = name  # "rail 1"
        self.ranks = ranks  # group rank of each member, in member order (= node order)
        self.position = position  # ours among the members
        self.sent = 0

    def start(self, what: str, call, nbytes: int = 0) -> Pending:
        """``call(group)`` started; ``nbytes``: what it sends to other nodes, counted in ``sent``."""
        label = f"{what} on {self.name} (ranks {', '.join(map(str, self.ranks))})"
        try:
            work = call(self.group)
        except Exception as error:
            raise self._failed(label, error) from error
        self.sent += nbytes
        return Pending((work,), label)

    def wait(self, pending: Pending) -> None:
        try:
            for work in pending.works:
                work.wait()
        except Exception as error:
            raise self._failed(pending.what, error) from error

    def run(self, what: str, call, nbytes: int = 0) -> None:
        self.wait(self.start(what, call, nbytes))

    def _failed(self, what: str, error: BaseException) -> InterNodeError:
        return InterNodeError(f"rank {self.rank} (node {self.node}): Gloo {what} failed: {type(error).__name__}: "
                              f"{error}")

    # -- the calls plans make ------------------------------------------------------

    def send(self, tensor: torch.Tensor, member: int) -> Pending:
        return self.start("send", lambda g: g.send([tensor], member, self.tag), tensor.nbytes)

    def recv(self, tensor: torch.Tensor, member: int) -> Pending:
        return self.start("receive", lambda g: g.recv([tensor], member, self.tag))

    def swap(self, outgoing: dict[int, torch.Tensor], incoming: dict[int, torch.Tensor]) -> Pending:
        """Send ``outgoing[m]`` to member m and receive ``incoming[m]`` from member m, all at once: one
        message each way per pair, one network round (Gloo's all_to_all between two ranks takes ~1 ms)."""
        parts = [self.recv(buffer, member) for member, buffer in incoming.items()]
        parts += [self.send(tensor, member) for member, tensor in outgoing.items()]
        return Pending(tuple(work for part in parts for work in part.works),
                       f"exchange on {self.name} (ranks {', '.join(map(str, self.ranks))})")

    def exchange(self, mine: torch.Tensor, theirs: dict[int, torch.Tensor]) -> None:
        """Send ``mine`` to every member in ``theirs`` (member -> receive buffer) and receive theirs."""
        self.wait(self.swap({member: mine for member in theirs}, theirs))

    def allreduce(self, tensor: torch.Tensor, gloo_op) -> Pending:
        opts = dist.AllreduceOptions()
        opts.reduceOp = gloo_op
        nbytes = tensor.nbytes
        return self.start("all_reduce", lambda g: g.allreduce([tensor], opts), nbytes)

    def allgather(self, outputs: list[torch.Tensor], input: torch.Tensor) -> Pending:
        from shmcoll._torch_compat import AllgatherOptions

        nbytes = input.nbytes * (len(self.ranks) - 1)
        return self.start("all_gather", lambda g: g.allgather([outputs], [input], AllgatherOptions()), nbytes)

    def alltoall(self, output: torch.Tensor, input: torch.Tensor, out_splits: list[int],
                 in_splits: list[int]) -> Pending:
        """Gloo's all_to_all_single over the members (splits in elements of dim 0, in member order)."""
        row = input.element_size() * (input[0].numel() if input.dim() > 1 else 1)
        nbytes = (sum(in_splits) - in_splits[self.position]) * row
        return self.start("all_to_all", lambda g: g.alltoall_base(output, input, out_splits, in_splits,
                                                                  dist.AllToAllOptions()), nbytes)

    def broadcast(self, tensor: torch.Tensor, root: int) -> Pending:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        nbytes = tensor.nbytes * (len(self.ranks) - 1) if root == self.position else 0
        return self.start("broadcast", lambda g: g.broadcast([tensor], opts), nbytes)

    def reduce(self, tensor: torch.Tensor, root: int, gloo_op) -> Pending:
        opts = dist.ReduceOptions()
        opts.reduceOp = gloo_op
        opts.rootRank = root
        nbytes = tensor.nbytes if root != self.position else 0
        return self.start("reduce", lambda g: g.reduce([tensor], opts), nbytes)

    def gather(self, outputs: list[torch.Tensor] | None, input: torch.Tensor, root: int) -> Pending:
        opts = dist.GatherOptions()
        opts.rootRank = root
        nbytes = input.nbytes if root != self.position else 0
        return self.start("gather", lambda g: g.gather([outputs] if outputs is not None else [], [input], opts),
                          nbytes)

    def scatter(self, output: torch.Tensor, inputs: list[torch.Tensor] | None, root: int) -> Pending:
        opts = dist.ScatterOptions()
        opts.rootRank = root
        nbytes = sum(t.nbytes for t in inputs or ()) - (inputs[self.position].nbytes if inputs else 0)
        return self.start("scatter", lambda g: g.scatter([output], [inputs] if inputs is not None else [], opts),
                          nbytes)

    def barrier(self) -> None:
        self.run("barrier", lambda g: g.barrier())

    def close(self) -> None:
        """Stop Gloo's threads now, while the interpreter is whole (see ``placement.nodes``)."""
        if self.group is not None:
            self.group.shutdown()
            self.group = None

    def drop(self) -> None:
        """Let go of the group without waiting (after a failure: its peers then see it close)."""
        self.group = None
