"""Several threads per rank for one collective: lanes.

One thread copies and reduces at a fraction of what a rank's cores can move
(2 ranks x 8 threads on 16 cores: one thread moves ~12% of it). So a collective
of at least ``split_bytes`` is cut into ``n`` lanes (``Lanes.for_bytes``): lane j takes the j-th
stretch of the message (cache-line aligned) and runs the ordinary schedule on
it, over its own control lines and slots (``Arena.lane_schedules``). Thread j of
every rank drives lane j, so threads of one rank never wait for each other
mid-collective, only for the same lane of the peers (vLLM's CPU all-reduce
pairs threads the same way). Every element is still reduced by the same kernel
in rank order, so results are bitwise those of one thread, whatever the lane
count.

The fan-out, the lanes and the join run in C without the GIL
(``_schedules.Pool``: the caller's thread drives lane 0, the pool's threads the
others, one call from Python per collective); Python steps in only when a wait
outlasts its slice, to decide as every wait does (``shmcoll.waits``).

Lanes must pair across ranks: the lane count is agreed when the arena is made
(``agree``; the arena's layout depends on it), and the number of lanes a
collective uses is a function of its size alone, the same on every rank.

A collective over lanes first posts a step of the arena's own carrying its
descriptor, without waiting: a peer in another collective on the arena's steps
sees it and raises (and this rank, between slices, sees theirs), where the
lanes alone would wait for each other until the timeout. The lanes have slots
of their own, so nothing else need wait for them.

Single copy (``_single_copy``) uses the same threads differently: its meetings stay on the caller's thread
and only the reads and reductions between them are split (``attach_single_copy``); that split is local to
the rank, so its lanes need not pair.
"""
from __future__ import annotations

import os
import time

from shmcoll import _schedules, _sync, descriptors, waits
from shmcoll.arena import lane_bytes
from shmcoll.algorithms.schedule import raise_mismatch
from shmcoll.errors import ShmcollError
from shmcoll.waits import reached

# The kinds of schedule a collective's lanes run (``_schedules``).
ONE_SHOT, CHUNKED, REDUCE_SCATTER, ALLGATHER, BROADCAST = (
    _schedules.ONE_SHOT, _schedules.CHUNKED, _schedules.REDUCE_SCATTER, _schedules.ALLGATHER, _schedules.BROADCAST)
# The all-reduce's schedule that never splits (an all-reduce's route names it: ``OneNode.allreduce_route``).
ONE_SHOT_STEPS = _schedules.ONE_SHOT_STEPS
_FINAL = (_schedules.DONE, _schedules.MISMATCH, _schedules.CANCELLED)
# Each lane's stretch of a message starts on a cache line, so a lane may get up to this much beyond an even share.
ALIGN_BYTES = 64


def agree(store, keys: str, rank: int, local_ranks: list[int], wanted: int, explicit: bool) -> int:
    """The lane count of a node's ranks: the least any of them asks for. ``wanted``: this rank's wish; unless it
    is ``explicit`` (SHMCOLL_THREADS), it is capped by the CPUs this rank may use, shared with the local ranks
    whose CPU sets overlap its own (ranks of a node that share every CPU share them out)."""
    cpus = sorted(os.sched_getaffinity(0))
    store.set(f"{keys}/threads/{rank}", f"{wanted} {','.join(map(str, cpus))}")
    mine = set(cpus)
    entries = [value.decode().split(" ") for value in store.multi_get([f"{keys}/threads/{r}" for r in local_ranks])]
    least = min(int(their_wanted) for their_wanted, _ in entries)
    sharing = sum(1 for _, their_cpus in entries if mine & set(map(int, their_cpus.split(","))))
    # Every rank must use the same count: the least of everyone's capped wish.
    store.set(f"{keys}/lanes/{rank}", str(capped(least, explicit, len(cpus), sharing)))
    return min(int(v) for v in store.multi_get([f"{keys}/lanes/{r}" for r in local_ranks]))


def capped(wanted: int, explicit: bool, cpus: int, sharing: int) -> int:
    """``wanted`` lanes within ``cpus`` CPUs shared by ``sharing`` local ranks, unless asked for ``explicit``ly
    (SHMCOLL_THREADS): by default a node's lanes do not outnumber its cores."""
    return wanted if explicit else min(wanted, max(1, cpus // max(1, sharing)))


class Lanes:
    """The lanes of one group's arena, and the pool of threads that drives them (none with one lane)."""

    def __init__(self, arena, min_bytes: int):
        self.arena = arena
        self.count = arena.lane_count  # agreed across the node; 1 = everything on the caller's thread
        self.min_bytes = min_bytes  # least bytes worth a lane of their own
        # The least message (bytes per rank) that runs on two lanes or more. Below it the placement runs the
        # schedule on the arena itself, on the caller's thread, without a call into this module.
        self.split_bytes = 2 * min_bytes if self.count > 1 else descriptors.BEYOND_ANY_MESSAGE
        # The most an even share of a message may hold so that every lane's stretch fits its slots.
        self.share_bytes = lane_bytes(arena.chunk_bytes) - ALIGN_BYTES if self.count > 1 else 0
        self._pool = None  # started by the first collective that splits (_started)
        self._lines: list[int] = []
        self._single_copy = None  # what uses the pool beside the lanes' schedules (attach_single_copy)

    def for_bytes(self, nbytes: int) -> int:
        """Lanes for a message of ``nbytes`` per rank, decided here alone: 1 below ``split_bytes``, else one per
        ``min_bytes``, at most ``count``; a function of the size alone, as lanes must pair across ranks."""
        return 1 if nbytes < self.split_bytes else min(self.count, nbytes // self.min_bytes)

    def describe(self, what: str) -> str:
        """The group summary's line on the lanes of each ``what`` (a collective, a node stage)."""
        return f"  threads per {what}: up to {self.count} (one per {self.min_bytes // 1024} KiB of message)"

    def run(self, kind: int, lanes: int, desc: int, count: int, itemsize: int, addr: int, *, out: int = 0,
            block_stride: int = 0, out_stride: int = 0, blocks: int = 0, kernel: int = 0, op: int = 0,
            scale: float = 1.0, root: int = -1) -> None:
        """One collective of ``kind`` over ``count`` items of ``itemsize`` bytes at ``addr``, on ``lanes`` lanes
        (``for_bytes``; at least 2): the schedules' arguments as ``shmcoll.algorithms`` passes them. (The
        compiled front, ``_front.SmallCollectives``, does the same in C up to ``finish``.)"""
        arena = self.arena
        self._started()
        fence = arena.next_step()
        arena.post(fence, desc)  # see the module's docstring
        if not self._pool.start(kind, lanes, desc, addr, out, count, itemsize, max(1, ALIGN_BYTES // itemsize),
                                block_stride, out_stride, blocks, kernel, op, scale, root):
            self._settle(lanes, fence, desc)
        self._raise_if_failed(lanes, desc)

    def finish(self, lanes: int, fence: int, desc: int) -> None:
        """The rest of a collective whose lanes were started after posting step ``fence`` (``run``, or the
        compiled front through ``starter``) and did not all end DONE within the first slice: settled here, then
        raised on if a lane failed."""
        self._settle(lanes, fence, desc)
        self._raise_if_failed(lanes, desc)

    def starter(self) -> tuple[int, int]:
        """(the C function that starts a collective over the lanes, the pool): for the compiled front, which
        calls it without Python (``_schedules.Pool.starter``); the pool is started here if it was not. Valid
        until ``close``."""
        return self._started().starter()

    def _started(self):
        """The pool, started at the first collective that splits (a group may never need its threads)."""
        if self._pool is None:
            arena = self.arena
            schedules = arena.lane_schedules()
            self._lines = [s.lines for s in schedules]
            self._pool = _schedules.Pool(schedules, waits.lane_idle_spin_ns(arena.lanes_oversubscribe))
        return self._pool

    def attach_single_copy(self, single_copy) -> None:
        """Let ``single_copy`` (the arena's ``_single_copy.SingleCopy``) split its reads and reductions over
        the pool's threads (started here if they were not), until ``close``."""
        if self._single_copy is not single_copy:
            single_copy.set_lanes(*self._started().runner())
            self._single_copy = single_copy

    def _settle(self, lanes: int, fence: int, desc: int) -> None:
        """The rest of a collective whose lanes waited longer than a slice: between slices, the checks of every
        wait (abort, dead or abandoned peers, the timeout: ``waits.Watch``), and whether a peer is in another
        collective on the arena's steps; on any of them, every lane is stopped before the error is raised."""
        arena = self.arena
        watch = arena.watch
        start, warn_after = time.monotonic(), watch.first_warning()
        what = arena.describe() if arena.describe else descriptors.describe(desc)
        try:
            while True:
                arena.check_same_collective(fence, desc)
                behind = self._behind(lanes)
                if behind:
                    warn_after = watch.check(behind, time.monotonic() - start, what, warn_after)
                else:
                    watch.raise_if_aborted(what)
                if self._pool.advance():
                    return
        except BaseException:
            self._pool.cancel()
            raise

    def _behind(self, lanes: int) -> list[int]:
        """The local ranks some lane is waiting for now."""
        arena, behind = self.arena, set()
        for j in range(lanes):
            status, waiting, _ = self._pool.lane(j)
            if status not in _FINAL:
                behind.update(r for r in range(arena.local_size)
                              if r != arena.local_rank and not reached(_sync.load_step(self._lines[j], r), waiting))
        return sorted(behind)

    def _raise_if_failed(self, lanes: int, desc: int) -> None:
        for j in range(lanes):
            status, _, base = self._pool.lane(j)
            if status == _schedules.MISMATCH:
                raise_mismatch(self.arena, base + 1, desc, lines=self._lines[j])
        cancelled = [j for j in range(lanes) if self._pool.lane(j)[0] != _schedules.DONE]
        if cancelled:  # not by us, nor by a mismatch: cannot happen
            raise ShmcollError(f"lanes {cancelled} of {descriptors.describe(desc)} stopped before the end")

    def close(self) -> None:
        """Stop the lane threads (each finishes its current job first)."""
        if self._single_copy is not None:
            self._single_copy.set_lanes(0, 0)
            self._single_copy = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
