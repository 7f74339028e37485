"""Every rank of the group on this node: collectives through the node's shared arena.

Tensors become raw addresses here (the algorithms know no torch): contiguous
tensors are used in place, others through a contiguous stand-in that is copied
back after (``shmcoll.staging``).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from shmcoll import lanes as _lanes
from shmcoll import ops
from shmcoll.descriptors import BEYOND_ANY_MESSAGE
from shmcoll.algorithms import allgather, allreduce, alltoall, barrier, broadcast, gather, reduce_scatter, scatter
from shmcoll.p2p import PointToPoint, Recv, Send
from shmcoll.placement import copy_path
from shmcoll.placement.whole import allgather_whole
from shmcoll.staging import apart, staged, staged_empty, unstage


# Where reading the peers' buffers (single copy) beat the copy path through the arena: (least, most) bytes
# per rank (a reduce-scatter's output, an all-gather's input, a broadcast's or all-reduce's message),
# measured at 2 ranks on the 2-core Intel VM (BENCHMARKS.md, "Single copy"), alternating the two paths.
# Single copy copies each byte once, but in the kernel, which pins each page first: for a few KiB the
# extra synchronisation costs more than the copy it saves; a broadcast above 1 MiB has one reader where
# the copy path keeps both ranks copying; an all-reduce below 2 MiB does its chunks in cache-sized
# steps that single copy's three meetings do not beat, and at 64 MiB the kernel's copy is the slower.
SINGLE_COPY_SPANS = {
    "all_gather": (16 << 10, None), "reduce_scatter": (16 << 10, None),
    "broadcast": (8 << 10, 1 << 20), "all_reduce": (2 << 20, 32 << 20),
}
# Everything that has a single-copy path. reduce, gather, scatter, all_to_all and point_to_point have no measured span
# (measuring one needs a machine where reads are cheap; ``bench/bench_single_copy.py`` measures them), so
# they read directly only where SHMCOLL_SINGLE_COPY=1 forces it. all_to_all never has a span by size: its
# ranks' sizes differ, and its path must be the same on every rank.
SINGLE_COPY_KINDS = (*SINGLE_COPY_SPANS, "reduce", "gather", "scatter", "all_to_all", "point_to_point")
# Single copy pays only where the kernel's read of a peer is cheap: it saves one or two copies (into the
# arena and out of it) per byte and reads once instead. On the Intel VM whose spans these are, a 256 KiB
# broadcast took 16 us by a read against 24 us by two copies (about one copy per read, judged from those
# times; the probe's read_cost was not measured there). On an AMD EPYC VM the probe finds a read costs 3.4-6.5
# copies (single_copy.read_cost), and there every collective lost 25-67% to the copy path from 32 KiB to
# 16 MiB, both paths interleaved in one job (bench/bench_single_copy.py; BENCHMARKS.md, "Single copy").
READ_COST_LIMIT = 2.0


def single_copy_spans(verdict, mode: str) -> dict:
    """The collectives that read the peers' buffers, and at which sizes (``SINGLE_COPY_SPANS``' form), for a
    node's ``single_copy.Verdict`` and SHMCOLL_SINGLE_COPY (``mode``): none where refused; every size of
    every collective of ``SINGLE_COPY_KINDS`` where forced ("1"); else the measured spans where a read costs less than
    ``READ_COST_LIMIT`` copies, and none where it costs more."""
    if verdict.refused is not None:
        return {}
    if mode == "1":
        return {kind: (0, None) for kind in SINGLE_COPY_KINDS}
    return dict(SINGLE_COPY_SPANS) if verdict.read_cost < READ_COST_LIMIT else {}


def _span(least: int, most: int | None) -> str:
    return f"from {least >> 10} KiB" + (f" to {most >> 10} KiB" if most is not None else "")


class CompiledPaths(NamedTuple):
    """What the group's compiled collectives and transfers run on (``Collectives``): the arena's steps and
    schedule, per collective the most bytes per rank they take (``compiled_bytes``: up to single copy's span),
    the all-reduce's one-step limit on one lane (``one_step_bytes``) and its route above it
    (``allreduce_route``), the lanes (``shmcoll.lanes.Lanes``: ``split_bytes``, ``for_bytes``, ``starter``,
    ``finish``), how large an asynchronous call they begin (``async_try_bytes``; never one over lanes), the
    point-to-point engine, and the size tables all_to_all writes before its first step."""
    steps: object  # arena.Steps
    schedule: object  # _schedules.Schedule
    compiled_bytes: dict
    one_step_bytes: int
    allreduce_route: object
    lanes: object
    async_try_bytes: int
    p2p: PointToPoint
    size_tables: tuple  # (address of buffer 0's size tables, of buffer 1's, bytes per rank's row): all_to_all's


class OnArena:
    """What every placement that holds a node arena does with it when the group is aborted or closed."""

    arena = None

    def compiled_paths(self) -> CompiledPaths | None:
        """What the compiled small paths run on; None: none run here (several nodes)."""
        return None

    def abort(self, why: str) -> None:
        """Make every wait on the arena raise at its next slice, here and (``abandon``) on the local peers.
        (A Gloo call in flight between nodes ends only at Gloo's own timeout: Gloo offers no abort.)"""
        if self.arena is not None:
            self.arena.abort(why)

    def abandon(self) -> None:
        """This rank takes no further step in the group (a collective of its failed part-way): the local peers'
        waits raise within a slice (``Arena.abandon``) instead of at the timeout."""
        if self.arena is not None:
            self.arena.abandon()

    def _close_arena(self) -> None:
        """Unmap the arena: every later use raises."""
        if self.arena is not None:
            self.arena.close()
            self.arena = None


class OneNode(OnArena):
    """The group's placement when all its ranks share one arena."""

    # No asynchronous collective runs inline on the Python path: it would wait for its peers there, and an
    # asynchronous call must not (a program that issues it and then a call its peers make first would hang).
    async_inline = False
    # One of at most this many bytes per rank that the compiled small collectives take runs there as far as it
    # goes without waiting for a peer, the rest on the progress thread: handing a whole collective to the thread
    # costs 100-200 us on the 2-core VM (the general path's Python, run with the caches the last exchange left
    # cold, and the thread's wake-up), about what a 1 MiB all-reduce takes (160-230 us), so overlap could not pay
    # for it up to there (BENCHMARKS.md, "Asynchronous and functional calls"). Never a call over lanes: those the
    # front leaves to the progress thread.
    async_try_bytes = 1 << 20

    def __init__(self, arena, rank: int, settings, waits, lanes, single_copy):
        self.arena = arena
        self.rank = rank
        self.waits = waits  # waits.Policy
        self.lanes = lanes  # large collectives over several threads (shmcoll.lanes)
        # Between two ranks with one lane each, every all-reduce is one-shot: in one step up to a slot, in steps
        # of a slot above (allreduce.ONE_SHOT_STEPS_RANKS); between more, chunked reduce-scatter + all-gather
        # above the one-shot's limit.
        self.one_shot_steps = allreduce.one_shot_steps_apply(arena.local_size, lanes.count)
        # All-reduces up to this size exchange everything in one step (one slot per rank, or per rank and lane).
        self.one_shot_bytes = arena.chunk_bytes if self.one_shot_steps else allreduce.one_shot_limit(
            settings.small_bytes, arena.chunk_bytes, arena.local_size, lanes.count, lanes.split_bytes,
            lanes.share_bytes)
        self.settings = settings
        self.nodes = [arena.ranks]
        self.single_copy = single_copy  # the node's single_copy.Verdict
        self.single_copy_spans = single_copy_spans(single_copy, settings.single_copy)
        if self.single_copy_spans:  # the same verdict and settings on every rank of the node
            arena.enable_single_copy()
        direct = self.single_copy_spans.get("point_to_point")  # a sender decides; its receiver follows
        self.p2p = PointToPoint(arena, f"rank{rank}", direct_from=direct[0] if direct else None,
                                budgets=waits.inline)
        # The messages the group's compiled collectives take (_front.SmallCollectives): every size of the copy
        # path, the all-reduces of one one-shot step and those below single copy's span, and the broadcasts,
        # all-gathers, reduce-scatters (per block), reduces, gathers and scatters below it; all_to_all at every size
        # or none (as ``_single_copy_alltoall``), the most of its input and output.
        self.compiled_bytes = {"all_reduce": max(self.one_shot_bytes, self._below_single_copy("all_reduce")),
                               **{kind: self._below_single_copy(kind)
                                  for kind in ("broadcast", "all_gather", "reduce_scatter", "reduce", "gather",
                                               "scatter")},
                               "all_to_all": 0 if self._single_copy_alltoall() else BEYOND_ANY_MESSAGE}

    def compiled_paths(self) -> CompiledPaths | None:
        one_step = int(min(self.one_shot_bytes, self.lanes.split_bytes - 1))  # one step on the caller's thread
        return CompiledPaths(self.arena, self.arena.schedule, self.compiled_bytes, one_step, self.allreduce_route,
                             self.lanes, self.async_try_bytes, self.p2p, self._size_tables())

    def _size_tables(self) -> tuple[int, int, int]:
        """Where the arena's size tables are, as addresses (``Arena.tables``' arrays would keep the segment mapped
        after the group closes it)."""
        tables = [self.arena.tables(buffer) for buffer in (0, 1)]
        return tables[0].ctypes.data, tables[1].ctypes.data, tables[0].strides[0]

    def _below_single_copy(self, kind: str) -> int:
        """The most bytes per rank up to which no message of ``kind`` reads the peers' buffers (``_single_copy``)."""
        span = self.single_copy_spans.get(kind)
        return BEYOND_ANY_MESSAGE if span is None else max(0, span[0] - 1)

    def _single_copy(self, kind: str, nbytes: int) -> bool:
        """Whether a collective ``kind`` of ``nbytes`` per rank reads the peers' buffers directly: in its span
        (``single_copy_spans``)."""
        span = self.single_copy_spans.get(kind)
        if span is None:
            return False
        least, most = span
        return least <= nbytes and (most is None or nbytes <= most)

    def _single_copy_lanes(self, nbytes: int) -> int:
        """The lanes a single-copy collective of ``nbytes`` per rank splits its reads and reductions over
        (``Lanes.for_bytes``, as the copy path's), the lanes' threads lent to single copy where it splits."""
        lanes = self.lanes.for_bytes(nbytes)
        if lanes > 1:
            self.lanes.attach_single_copy(self.arena.single_copy)
        return lanes

    def _alltoall_lanes(self, recv) -> int:
        """The lanes a single-copy all_to_all splits its reads over: by the bytes it receives per rank (each
        rank decides alone; single copy's split needs no agreement)."""
        return self._single_copy_lanes(sum(n for _, n in recv) // max(1, len(recv)))

    def _single_copy_alltoall(self) -> bool:
        """Whether all_to_all reads the peers' buffers directly: at every size or none (its ranks' sizes differ,
        so no size can decide it alike on every rank)."""
        return self.single_copy_spans.get("all_to_all") == (0, None)

    # -- reductions ----------------------------------------------------------

    def allreduce_route(self, nbytes: int) -> tuple[int, int]:
        """How an all-reduce of ``nbytes`` (> 0) per rank below single copy's span runs: (its schedule, one of
        ``shmcoll.lanes``' ONE_SHOT, ONE_SHOT_STEPS and CHUNKED; the lanes it splits over), decided here alone
        (the compiled front asks it too, above its one-step limit)."""
        if nbytes <= self.one_shot_bytes:
            return _lanes.ONE_SHOT, self.lanes.for_bytes(nbytes)
        if self.one_shot_steps:
            return _lanes.ONE_SHOT_STEPS, 1
        return _lanes.CHUNKED, self.lanes.for_bytes(nbytes)

    def allreduce(self, tensor: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        flat = red.view(tensor)
        count, itemsize = flat.numel(), flat.element_size()
        if count == 0:  # still a collective: a rank that brings data must not wait alone
            return barrier.barrier(self.arena, desc)
        work = staged(flat)
        nbytes = count * itemsize
        if nbytes > self.one_shot_bytes and self._single_copy("all_reduce", nbytes):
            allreduce.single_copy(self.arena, work.data_ptr(), count, itemsize, red.kernel, red.op.kernel, red.scale,
                                  desc, lanes=self._single_copy_lanes(nbytes))
        else:
            copy_path.allreduce(self.arena, self.lanes, self.allreduce_route(nbytes), count, itemsize, work.data_ptr(),
                                red.kernel, red.op.kernel, red.scale, desc)
        unstage(flat, work)

    def one_shot(self, tensor: torch.Tensor, count: int, red: ops.Reduction, desc: int) -> None:
        """All-reduce in one step: ``tensor`` contiguous, ``count`` (> 0) elements of ``red``'s dtype, at most
        ``one_shot_bytes``; the surface's small all-reduce path calls it directly."""
        itemsize = red.dtype.numpy.itemsize
        copy_path.allreduce(self.arena, self.lanes, self.allreduce_route(count * itemsize), count, itemsize,
                            tensor.data_ptr(), red.kernel, red.op.kernel, red.scale, desc)

    def reduce(self, tensor: torch.Tensor, root: int, red: ops.Reduction, desc: int) -> None:
        flat = red.view(tensor)
        if flat.numel() == 0:
            return barrier.barrier(self.arena, desc)
        work = staged(flat)
        self._chunked(work, red, desc, root)
        if self.rank == root:
            unstage(flat, work)

    def _chunked(self, work: torch.Tensor, red: ops.Reduction, desc: int, root: int) -> None:
        """Reduce the contiguous ``work`` to ``root`` in place: by single copy in its span, else chunked, over
        the lanes its size calls for."""
        addr, itemsize = work.data_ptr(), work.element_size()
        nbytes = work.numel() * itemsize
        if self._single_copy("reduce", nbytes):
            return allreduce.single_copy(self.arena, addr, work.numel(), itemsize, red.kernel, red.op.kernel,
                                         red.scale, desc, root, self._single_copy_lanes(nbytes))
        copy_path.reduce(self.arena, self.lanes, work.numel(), itemsize, addr, red.kernel, red.op.kernel, red.scale,
                         root, desc)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        """``input``: contiguous, the group's size times ``output``'s elements, rank r's block r-th."""
        out = red.view(output)
        source = red.view(input)
        if out.numel() == 0:
            return barrier.barrier(self.arena, desc)
        target = staged(out)
        addr, into, block, itemsize = source.data_ptr(), target.data_ptr(), out.numel(), out.element_size()
        if self._single_copy("reduce_scatter", block * itemsize):
            if into != addr + self.arena.local_rank * block * itemsize:  # our block in place: only we read it
                source, = apart([source], [target])
            reduce_scatter.single_copy(self.arena, source.data_ptr(), block, itemsize, red.kernel, red.op.kernel,
                                       red.scale, into, desc, self._single_copy_lanes(block * itemsize))
            return unstage(out, target)
        copy_path.reduce_scatter(self.arena, self.lanes, block, itemsize, addr, block, into, red.kernel, red.op.kernel,
                                 red.scale, desc)
        unstage(out, target)

    # -- data movement -------------------------------------------------------

    def broadcast(self, tensor: torch.Tensor, root: int, desc: int) -> None:
        if tensor.numel() == 0:
            return barrier.barrier(self.arena, desc)
        work = staged(tensor)
        addr = work.data_ptr()
        if self._single_copy("broadcast", tensor.nbytes):
            broadcast.single_copy(self.arena, addr, tensor.nbytes, root, desc, self._single_copy_lanes(tensor.nbytes))
            return unstage(tensor, work)
        copy_path.broadcast(self.arena, self.lanes, addr, tensor.nbytes, root, desc)
        unstage(tensor, work)

    def allgather(self, outputs: list[torch.Tensor], input: torch.Tensor, desc: int) -> None:
        if input.numel() == 0:
            return barrier.barrier(self.arena, desc)
        source = input.contiguous()
        targets = [staged_empty(out) for out in outputs]
        if self._single_copy("all_gather", source.nbytes):
            # Our own output may be the input itself (in place), which the schedule leaves alone.
            me = self.arena.local_rank
            others = targets[:me] + targets[me + 1:]
            source, = apart([source], others if targets[me].data_ptr() == source.data_ptr() else targets)
            allgather.single_copy_each(self.arena, source.data_ptr(), source.nbytes, [t.data_ptr() for t in targets],
                                       desc, self._single_copy_lanes(source.nbytes))
        else:
            copy_path.allgather(self.arena, self.lanes, source.data_ptr(), source.nbytes,
                                [t.data_ptr() for t in targets], desc)
        for out, target in zip(outputs, targets):
            unstage(out, target)

    def allgather_into(self, output: torch.Tensor, input: torch.Tensor, desc: int) -> None:
        nbytes = input.nbytes
        if nbytes == 0:
            return barrier.barrier(self.arena, desc)
        source = input.contiguous()
        target = staged_empty(output)
        addr, out = source.data_ptr(), target.data_ptr()
        if self._single_copy("all_gather", nbytes):
            if addr != out + self.arena.local_rank * nbytes:  # in place (our block) the schedule leaves alone
                source, = apart([source], [target])
                addr = source.data_ptr()
            allgather.single_copy(self.arena, addr, nbytes, out, nbytes, desc, self._single_copy_lanes(nbytes))
            return unstage(output, target)
        copy_path.allgather(self.arena, self.lanes, addr, nbytes, (out, nbytes), desc)
        unstage(output, target)

    def allgather_windows(self, input: torch.Tensor, unit: int, consume, desc: int) -> None:
        nbytes = input.nbytes
        if nbytes == 0:
            return barrier.barrier(self.arena, desc)
        window = self.arena.chunk_bytes // unit * unit
        if window == 0:  # a unit larger than a slot
            return allgather_whole(self, self.arena.local_size, input, consume, desc)
        source = input.contiguous()
        allgather.allgather_windows(self.arena, source.data_ptr(), nbytes, window, consume, desc)

    def gather(self, outputs: list[torch.Tensor] | None, input: torch.Tensor, root: int, desc: int) -> None:
        nbytes = input.nbytes
        if nbytes == 0:
            return barrier.barrier(self.arena, desc)
        source = input.contiguous()
        targets = [staged_empty(out) for out in outputs] if outputs is not None else []
        if self._single_copy("gather", nbytes):
            gather.single_copy(self.arena, source.data_ptr(), nbytes, root, [t.data_ptr() for t in targets], desc,
                               self._single_copy_lanes(nbytes))
        else:
            gather.gather(self.arena, source.data_ptr(), nbytes, root, [t.data_ptr() for t in targets], desc)
        for out, target in zip(outputs or [], targets):
            unstage(out, target)

    def scatter(self, output: torch.Tensor, inputs: list[torch.Tensor] | None, root: int, desc: int) -> None:
        nbytes = output.nbytes
        if nbytes == 0:
            return barrier.barrier(self.arena, desc)
        sources = [t.contiguous() for t in inputs] if inputs is not None else []
        target = staged_empty(output)
        if self._single_copy("scatter", nbytes):
            scatter.single_copy(self.arena, [t.data_ptr() for t in sources], nbytes, root, target.data_ptr(), desc,
                                self._single_copy_lanes(nbytes))
        else:
            scatter.scatter(self.arena, [t.data_ptr() for t in sources], nbytes, root, target.data_ptr(), desc)
        unstage(output, target)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], desc: int) -> None:
        sources = [t.contiguous() for t in inputs]
        targets = [staged_empty(t) for t in outputs]
        single = self._single_copy_alltoall()
        if single:
            sources = apart(sources, targets)
        send = [(t.data_ptr(), t.nbytes) for t in sources]
        recv = [(t.data_ptr(), t.nbytes) for t in targets]
        if single:
            alltoall.single_copy(self.arena, send, recv, desc, self._alltoall_lanes(recv))
        else:
            alltoall.alltoall(self.arena, send, recv, desc)
        for out, target in zip(outputs, targets):
            unstage(out, target)

    def alltoall_single(self, output: torch.Tensor, input: torch.Tensor, out_blocks, in_blocks, desc: int) -> None:
        """``out_blocks``/``in_blocks``: (byte offset, byte count) of each rank's block."""
        source = input.contiguous()
        target = staged_empty(output)
        single = self._single_copy_alltoall()
        if single:
            source, = apart([source], [target])
        base_in, base_out = source.data_ptr(), target.data_ptr()
        send = [(base_in + off, n) for off, n in in_blocks]
        recv = [(base_out + off, n) for off, n in out_blocks]
        if single:
            alltoall.single_copy(self.arena, send, recv, desc, self._alltoall_lanes(recv))
        else:
            alltoall.alltoall(self.arena, send, recv, desc)
        unstage(output, target)

    def barrier(self, desc: int) -> None:
        barrier.barrier(self.arena, desc)

    # -- point-to-point ------------------------------------------------------

    def send(self, tensor: torch.Tensor, dst: int, tag: int):
        source = tensor.contiguous()
        return self.p2p.start(Send(self.p2p, dst, source.data_ptr(), source.nbytes, tag, [source]))

    def recv(self, tensor: torch.Tensor, src: int | None, tag: int):
        """Into the contiguous ``tensor``, from ``src``, or from whichever rank sends first when ``src`` is None."""
        return self.p2p.start(Recv(self.p2p, src, tensor.data_ptr(), tensor.nbytes, tag, [tensor]))

    # -- lifecycle -------------------------------------------------------------

    def set_background(self, on: bool) -> None:
        """Collectives that follow run on the progress thread (``on``) or inline."""
        self.waits.apply(self.arena, on)

    def summary(self) -> list[str]:
        arena, s = self.arena, self.settings
        return [f"  arena: {arena.segment.size / 2**20:.1f} MiB for {arena.local_size} local ranks, "
                f"{s.chunk_bytes // 1024} KiB chunks, {s.p2p_bytes // 1024} KiB p2p channels",
                f"  all_reduce: one-shot up to {self.one_shot_bytes} B, "
                + ("one-shot steps of a chunk above" if self.one_shot_steps else
                   "chunked reduce-scatter + all-gather above"),
                self.lanes.describe("collective"),
                "  single copy: " + (f"off ({self.single_copy.refused})" if self.single_copy.refused else
                                     "every size (SHMCOLL_SINGLE_COPY=1)" if s.single_copy == "1" else
                                     f"a read costs {self.single_copy.read_cost:.2f} copies here; " + (
                                         ", ".join(f"{kind} {_span(*span)}"
                                                   for kind, span in self.single_copy_spans.items())
                                         or "off (the copy path is faster)")),
                self.waits.describe()]

    def close(self) -> None:
        """Stop the lane and p2p threads and unmap the arena (every later use raises)."""
        if self.lanes is not None:
            self.lanes.close()
            self.lanes = None
        if self.p2p is not None:
            self.p2p.close()
            self.p2p = None
        self._close_arena()
