"""The network stage: every Gloo call a plan across nodes makes, through one funnel.

A call starts asynchronously (Gloo runs it on its own threads, so a plan can
overlap it with a node stage) and is waited for here; a failure becomes an
InterNodeError naming this rank, the group it was on and the ranks in it, and
carrying the ranks at the other end of the failed call's connections (``peers``:
``placement.across.causes`` learns from them whether a rank died), and the plan
that made it gives up for good (``placement.nodes``). ``sent`` counts
the bytes this rank handed to Gloo for other nodes (benchmarks, the netns test).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

from shmcoll.errors import InterNodeError
from shmcoll.staging import flat_bytes


# Up to this many members, a stage in which every member sends to every other does it with direct
# messages (N - 1 each way, all at once: one network round); beyond, with Gloo's collective.
EXCHANGE_NODES = 8


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, as Gloo's collectives are given them: they refuse int16, uint16-64 and
    the float8 types, and gather no complex tensor, while bytes go through every one of them."""
    return flat_bytes(tensor)


class Pending(NamedTuple):
    works: tuple  # c10d Works, all of one network stage
    what: str  # "all_reduce on rail 1 (ranks 1, 3)", for errors
    # Per work, the group ranks at the other end of its connections: a message's one peer, a collective's
    # every other member. A work fails when one of those connections does.
    peers: tuple
    # What follows once the works are done: a local step that may start the stage's next network round
    # (a reduce-scatter's combine, then its all-gather), returning that round's Pending, or None.
    then: Callable[[], Pending | None] | None = None

    def followed_by(self, step: Callable[[], Pending | None]) -> Pending:
        return self._replace(then=step)


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

    def start(self, what: str, call, nbytes: int = 0, member: int | None = None) -> Pending:
        """``call(group)`` started; ``nbytes``: what it sends to other nodes, counted in ``sent``; ``member``:
        the one member it exchanges with (a message), None for a collective of every member."""
        label = f"{what} on {self.name} (ranks {', '.join(map(str, self.ranks))})"
        peers = (self.ranks[member],) if member is not None else \
            tuple(rank for position, rank in enumerate(self.ranks) if position != self.position)
        try:
            work = call(self.group)
        except Exception as error:
            raise self._failed(label, error, peers) from error
        self.sent += nbytes
        return Pending((work,), label, (peers,))

    def wait(self, pending: Pending | None) -> None:
        """Until ``pending`` and every round that follows it are done."""
        while pending is not None:
            for work, peers in zip(pending.works, pending.peers):
                try:
                    work.wait()
                except Exception as error:
                    raise self._failed(pending.what, error, peers) from error
            pending = pending.then() if pending.then is not None else None

    def run(self, what: str, call, nbytes: int = 0) -> None:
        self.wait(self.start(what, call, nbytes))

    def _failed(self, what: str, error: BaseException, peers: tuple) -> InterNodeError:
        return InterNodeError(f"rank {self.rank} (node {self.node}): Gloo {what} failed: {type(error).__name__}: "
                              f"{error}", peers)

    # -- the calls plans make ------------------------------------------------------

    def send(self, tensor: torch.Tensor, member: int) -> Pending:
        return self.start("send", lambda g: g.send([tensor], member, self.tag), tensor.nbytes, member)

    def recv(self, tensor: torch.Tensor, member: int) -> Pending:
        return self.start("receive", lambda g: g.recv([tensor], member, self.tag), member=member)

    def swap(self, outgoing: dict[int, torch.Tensor], incoming: dict[int, torch.Tensor]) -> Pending:
        """Send ``outgoing[m]`` to member m and receive ``incoming[m]`` from member m, all at once: one
        message each way per pair, one network round (Gloo's all_to_all between two ranks takes ~1 ms)."""
        parts = [self.recv(buffer, member) for member, buffer in incoming.items()]
        parts += [self.send(tensor, member) for member, tensor in outgoing.items()]
        return Pending(tuple(work for part in parts for work in part.works),
                       f"exchange on {self.name} (ranks {', '.join(map(str, self.ranks))})",
                       tuple(peers for part in parts for peers in part.peers))

    def exchange(self, mine: torch.Tensor, theirs: dict[int, torch.Tensor]) -> None:
        """Send ``mine`` to every member in ``theirs`` (member -> receive buffer) and receive theirs."""
        self.wait(self.swap({member: mine for member in theirs}, theirs))

    def allgather(self, outputs: list[torch.Tensor], input: torch.Tensor) -> Pending:
        from shmcoll._torch_compat import AllgatherOptions

        nbytes = input.nbytes * (len(self.ranks) - 1)
        targets, source = [as_bytes(t) for t in outputs], as_bytes(input)
        return self.start("all_gather", lambda g: g.allgather([targets], [source], AllgatherOptions()), nbytes)

    def alltoall(self, output: torch.Tensor, input: torch.Tensor, out_splits: list[int],
                 in_splits: list[int]) -> Pending:
        """Gloo's all_to_all_single over the members (splits in elements of dim 0, in member order)."""
        row = input.element_size() * math.prod(input.shape[1:])  # bytes of one element of dim 0
        nbytes = (sum(in_splits) - in_splits[self.position]) * row
        target, source = as_bytes(output), as_bytes(input)
        out_bytes, in_bytes = [n * row for n in out_splits], [n * row for n in in_splits]
        return self.start("all_to_all", lambda g: g.alltoall_base(target, source, out_bytes, in_bytes,
                                                                  dist.AllToAllOptions()), nbytes)

    def broadcast(self, tensor: torch.Tensor, root: int) -> Pending:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        nbytes = tensor.nbytes * (len(self.ranks) - 1) if root == self.position else 0
        data = as_bytes(tensor)
        return self.start("broadcast", lambda g: g.broadcast([data], opts), nbytes)

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
