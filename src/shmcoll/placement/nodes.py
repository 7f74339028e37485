"""Collectives across nodes: a shm arena inside each node, Gloo between nodes (``placement.across``).

``Nodes`` is the placement: it builds the group's ``Shape`` (nodes, rails, index
tables) and ``Links`` (its Gloo groups) once and hands each collective to its
plan in ``placement.across``.
Nodes of unequal size take the plans that cross between the nodes' leaders where
those exist (all_reduce, reduce, broadcast, barrier, all_to_all), else one Gloo
group over all ranks (``placement.flat``, decided once: ``moves``), as do
point-to-point messages.

Every method runs inside the backend's ProgressEngine (in issue order) and
completes synchronously. A plan that fails part-way, on the network or in a
node stage, gives up for good (``_gives_up_on_failure``), telling the other
ranks why first (``placement.across.causes``).
"""
from __future__ import annotations

import functools
import time
import traceback

import torch
import torch.distributed as dist

from shmcoll import ops
from shmcoll.errors import InterNodeError, ShmcollError, SizesDisagreeError
from shmcoll.lanes import Lanes
from shmcoll.placement.across import allgather as _allgather
from shmcoll.placement.across import allreduce as _allreduce
from shmcoll.placement.across import alltoall as _alltoall
from shmcoll.placement.across import barrier as _barrier
from shmcoll.placement.across import broadcast as _broadcast
from shmcoll.placement.across import gather as _gather
from shmcoll.placement.across import reduce as _reduce
from shmcoll.placement.across import reduce_scatter as _reduce_scatter
from shmcoll.placement.across.causes import Causes
from shmcoll.placement.across.links import Links
from shmcoll.placement.across.shape import Shape
from shmcoll.placement.flat import Flat
from shmcoll.placement.node import OnArena
from shmcoll.placement.whole import allgather_whole
from shmcoll.staging import apart, flat_bytes, staged_empty, unstage


def _gives_up_on_failure(plan):
    """A plan that fails part-way (a Gloo call between nodes, a dead or mismatched local peer)
    leaves its node's arena and its Gloo groups mid-collective: no later step on them can be trusted.

    So it tells the local ranks (its standing in the arena: gave up) and lets go of this rank's Gloo
    groups and of the plan's Gloo works, whose peers on other nodes then fail at once ("connection
    closed") instead of at the timeout, and raises a ShmcollError, after which the backend refuses every collective. Its message
    ends with the cause where that is another rank's failure (``Nodes.give_up``): what a rank sees of
    another's failure (a closed connection, a node mate that gave up) does not name the rank that died.
    """

    @functools.wraps(plan)
    def run(self, *args):
        if self.failure is not None:  # a point-to-point message between nodes failed since (``_Watched``)
            raise InterNodeError(f"rank {self.rank}: an earlier Gloo call between nodes failed: {self.failure}")
        started = time.monotonic()
        try:
            return plan(self, *args)
        except SizesDisagreeError:
            raise  # every rank found it alike, before any data moved: the group stays usable
        except Exception as error:
            # The plan's frames, which the error's traceback keeps (and the group keeps the error), hold its Gloo
            # works in flight, and a work holds its connections open: letting go of the groups alone left a peer
            # on another node waiting for this rank until Gloo's timeout.
            traceback.clear_frames(error.__traceback__)
            cause = self.give_up(error, time.monotonic() - started)
            if isinstance(error, ShmcollError):
                if not cause:
                    raise
                raise type(error)(f"{error}{cause}") from error
            raise InterNodeError(f"rank {self.rank} (node {self.shape.node}, ranks "
                                 f"{', '.join(map(str, self.shape.local_ranks))}): {plan.__name__} across nodes "
                                 f"failed part-way: {type(error).__name__}: {error}{cause}") from error

    return run


class Nodes(OnArena):
    """The group's placement across nodes: this rank's node arena, its rail, and the flat group."""

    one_shot_bytes = 0  # no small all-reduce path of the surface's: every all-reduce crosses nodes
    async_inline = False  # every collective waits for peers on other nodes: an asynchronous one is queued
    failure = None  # what made a point-to-point message fail, once one has

    def __init__(self, store, rank: int, size: int, timeout, topo, arena, keys: str, waits, settings):
        """``arena``: this rank's node arena (open_node_arena, with ``waits``, the ``waits.Policy`` across
        nodes), None when its node is itself alone."""
        self.rank, self.size = rank, size
        self.arena = arena
        self.waits = waits
        self.lanes = Lanes(arena, settings.thread_bytes) if arena is not None else None  # for the node stages
        self.shape = Shape(rank, size, topo, arena, self.lanes, settings)
        self.links = Links(store, keys, self.shape, timeout)
        self.causes = Causes(store, keys, self.shape, timeout.total_seconds(),
                             lambda: self.arena.exited_peers() if self.arena is not None else [])
        self.alltoall_agreed = _alltoall.Agreed()
        self.nodes = self.shape.nodes
        self.flat = Flat(self.links.pairs.group, rank, size)
        # Nodes of unequal size have no rails that carry equal shares: their all_gather, reduce_scatter,
        # gather and scatter run on the group of all ranks.
        self.moves = _OnRails(self.shape, self.links) if self.shape.uniform else self.flat

    # -- plans -----------------------------------------------------------------------

    @_gives_up_on_failure
    def allreduce(self, tensor: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        _allreduce.allreduce(self.shape, self.links, tensor, red, desc)

    @_gives_up_on_failure
    def reduce(self, tensor: torch.Tensor, root: int, red: ops.Reduction, desc: int) -> None:
        _reduce.reduce(self.shape, self.links, tensor, root, red, desc)

    @_gives_up_on_failure
    def broadcast(self, tensor: torch.Tensor, root: int, desc: int) -> None:
        _broadcast.broadcast(self.shape, self.links, tensor, root, desc)

    @_gives_up_on_failure
    def allgather_into(self, output: torch.Tensor, input: torch.Tensor, desc: int) -> None:
        self.moves.allgather_into(output, input, desc)

    @_gives_up_on_failure
    def allgather(self, outputs: list[torch.Tensor], input: torch.Tensor, desc: int) -> None:
        self.moves.allgather(outputs, input, desc)

    def allgather_windows(self, input: torch.Tensor, unit: int, consume, desc: int) -> None:
        allgather_whole(self, self.size, input, consume, desc)

    @_gives_up_on_failure
    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        self.moves.reduce_scatter(output, input, red, desc)

    @_gives_up_on_failure
    def gather(self, outputs: list[torch.Tensor] | None, input: torch.Tensor, root: int, desc: int) -> None:
        self.moves.gather(outputs, input, root, desc)

    @_gives_up_on_failure
    def scatter(self, output: torch.Tensor, inputs: list[torch.Tensor] | None, root: int, desc: int) -> None:
        self.moves.scatter(output, inputs, root, desc)

    @_gives_up_on_failure
    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], desc: int) -> None:
        targets = [staged_empty(t) for t in outputs]
        sources = apart([t.contiguous() for t in inputs], targets)  # as in alltoall_single
        _alltoall.alltoall(self.shape, self.links, self.alltoall_agreed, [flat_bytes(t) for t in sources],
                           [flat_bytes(t) for t in targets], desc)
        for out, target in zip(outputs, targets):
            unstage(out, target)

    @_gives_up_on_failure
    def alltoall_single(self, output: torch.Tensor, input: torch.Tensor, out_blocks, in_blocks, desc: int) -> None:
        """``out_blocks``/``in_blocks``: (byte offset, byte count) of each rank's block."""
        target = staged_empty(output)
        # Blocks leave for other nodes while this rank's arrive: an input that is also the output (in place)
        # would be overwritten before it is sent.
        source, = apart([input.contiguous()], [target])
        source, received = flat_bytes(source), flat_bytes(target)
        sends = [source[off:off + n] for off, n in in_blocks]
        _alltoall.alltoall(self.shape, self.links, self.alltoall_agreed, sends,
                           [received[off:off + n] for off, n in out_blocks], desc)
        unstage(output, target)

    @_gives_up_on_failure
    def barrier(self, desc: int) -> None:
        _barrier.barrier(self.shape, self.links, desc)

    def send(self, tensor: torch.Tensor, dst: int, tag: int):
        return _Watched(self.flat.send(tensor, dst, tag), self, f"send to rank {dst}", dst)

    def recv(self, tensor: torch.Tensor, src: int | None, tag: int):
        return _Watched(self.flat.recv(tensor, src, tag), self, f"receive from rank {src}" if src is not None
                        else "receive from any rank", src)

    # -- lifecycle -------------------------------------------------------------------

    def set_background(self, on: bool) -> None:
        """Waits across nodes are the same on the progress thread (``waits.policy``): nothing to change."""

    def summary(self) -> list[str]:
        shape = self.shape
        lines = [f"  nodes: {shape.nodes}; this node's arena: "
                 + (f"{self.arena.segment.size / 2**20:.1f} MiB" if self.arena is not None else "none (alone)"),
                 f"  across nodes: collectives of up to {shape.small_bytes} B (the whole message) cross in the "
                 f"fewest rounds, through the leaders or one rank per node; larger ones on every rail, "
                 f"all_to_all straight between ranks"
                 + ("" if shape.uniform else "; nodes of unequal size: reductions by the small plans, all_gather, "
                    "reduce_scatter, gather and scatter on one Gloo group over all ranks")
                 + "; point-to-point on one Gloo group over all ranks"]
        if self.arena is not None:
            lines.append(self.lanes.describe("node stage"))
            lines.append(self.waits.describe())
        return lines

    def close(self) -> None:
        if self.lanes is not None:  # its threads first: they drive the arena's lanes
            self.lanes.close()
            self.lanes = None
        self._close_arena()
        # Stop the Gloo groups' worker threads now, while the interpreter is whole: left to be
        # destroyed at interpreter exit, a Gloo group can abort the process ("terminate called
        # without an active exception").
        self.links.close()
        self.flat.drop()  # its group is the links' group of all ranks, closed with them

    def give_up(self, error: BaseException, took_s: float) -> str:
        """Give up for good after ``error``, raised by a plan or a point-to-point message that took ``took_s``:
        post why (``causes``), then let go of the arena and the Gloo groups. Returns what to add to the error's
        message: the cause, where it is another rank's failure (within ``causes.LEARN_S``), else ''."""
        return self.causes.give_up(error, took_s, self._let_go)

    def _let_go(self) -> None:
        self.abandon()
        self.links.drop()
        self.flat.drop()


class _OnRails:
    """The data-movement plans of nodes of equal size (``placement.across``), as ``Flat`` offers its own."""

    def __init__(self, shape, links):
        self.shape, self.links = shape, links

    def allgather_into(self, output: torch.Tensor, input: torch.Tensor, desc: int) -> None:
        _allgather.allgather_into(self.shape, self.links, output, input, desc)

    def allgather(self, outputs: list[torch.Tensor], input: torch.Tensor, desc: int) -> None:
        targets = [staged_empty(out) for out in outputs]
        _allgather.allgather(self.shape, self.links, [flat_bytes(t) for t in targets], input, desc)
        for out, target in zip(outputs, targets):
            unstage(out, target)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        _reduce_scatter.reduce_scatter(self.shape, self.links, output, input, red, desc)

    def gather(self, outputs: list[torch.Tensor] | None, input: torch.Tensor, root: int, desc: int) -> None:
        _gather.gather(self.shape, self.links, outputs, input, root, desc)

    def scatter(self, output: torch.Tensor, inputs: list[torch.Tensor] | None, root: int, desc: int) -> None:
        _gather.scatter(self.shape, self.links, output, inputs, root, desc)


class _Watched(dist.Work):
    """A point-to-point message on the flat Gloo group, as the caller sees it: Gloo's Work, except that its
    failure makes the placement give up, as a failed collective does, so the next collective on this
    rank raises and the peers' Gloo calls see the connections close."""

    def __init__(self, work, placement: Nodes, what: str, peer: int | None):
        super().__init__()
        self._work, self._placement, self._what, self._peer = work, placement, what, peer
        self._started = time.monotonic()

    def wait(self, timeout=None) -> bool:
        try:
            return self._work.wait() if timeout is None else self._work.wait(timeout)
        except Exception as error:
            placement = self._placement
            if placement.failure is None:
                # Its peer, from which ``causes`` may learn that it died: not where the caller's own timeout
                # ended the wait (the peer is then alive, only late).
                peers = (self._peer,) if self._peer is not None and timeout is None else ()
                failed = InterNodeError(f"rank {placement.rank}: Gloo {self._what} failed: {type(error).__name__}: "
                                        f"{error}", peers)
                placement.failure = f"{failed}{placement.give_up(failed, time.monotonic() - self._started)}"
            raise InterNodeError(placement.failure) from error

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self):
        return self._work.exception()

    def source_rank(self) -> int:
        return self._work.source_rank()

    _source_rank = source_rank  # the name torch.distributed.recv calls

    def result(self):
        return self._work.result()

    def get_future(self):
        return self._work.get_future()

    def synchronize(self) -> None:
        self._work.synchronize()
