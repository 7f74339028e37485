"""Several threads per rank for one large collective: lanes.

One thread copies and reduces at a fraction of what a rank's cores can move
(2 ranks x 8 threads on 16 cores: one thread moves ~12% of it). So a large
collective is cut into ``n`` lanes: lane j takes the j-th stretch of the
message (cache-line aligned) and runs the ordinary single-thread schedule on
it, over its own stretch of every slot and its own control lines
(``Arena.lanes``). Thread j of every rank drives lane j, so threads of one
rank never wait for each other mid-collective, only for the same lane of the
peers (vLLM's CPU all-reduce pairs threads the same way). Every element is
still reduced by the same kernel in rank order, so results are bitwise those
of one thread, whatever the lane count.

Lanes must pair across ranks: the lane count is agreed when the group is made
(the minimum over the node's ranks, ``agree``), and the number of lanes a
collective uses is a function of its size alone, the same on every rank.

Lanes and the arena's own steps share the buffers, so they are fenced: before
any lane writes, every rank posts an arena step and waits for all to reach it
(so nobody still reads an earlier step; this also checks that all ranks are in
the same collective); after the lanes, each rank posts an arena step meaning
"done reading every lane", which the next write to the arena waits for.

The lane threads are per group, started at the first collective that needs
them, and sleep on a queue in between (no core spins while idle).
"""
from __future__ import annotations

import queue
import threading

from shmcoll import waits
from shmcoll.algorithms import barrier
from shmcoll.errors import ShmcollError


def agree(store, keys: str, rank: int, local_ranks: list[int], wanted: int) -> int:
    """The lane count of a node's ranks: the least any of them asked for (each publishes ``wanted``)."""
    store.set(f"{keys}/threads/{rank}", str(wanted))
    peers = [f"{keys}/threads/{r}" for r in local_ranks]
    return min(int(value) for value in store.multi_get(peers))


def bounds(count: int, lanes: int, align: int) -> list[tuple[int, int]]:
    """[lo, hi) of each lane over ``count`` items, every lo a multiple of ``align`` items."""
    cuts = [count * j // lanes // align * align for j in range(lanes)] + [count]
    return list(zip(cuts, cuts[1:]))


class Lanes:
    """The lanes of one group's arena, and the threads that drive lanes 1..n-1 (the caller drives 0)."""

    def __init__(self, arena, count: int, min_bytes: int, name: str):
        self.arena = arena
        self.count = count  # agreed across the node; 1 = everything on the caller's thread
        self.min_bytes = min_bytes  # least bytes worth a lane of their own
        # The least message (bytes per rank) that runs on two lanes or more. Below it the placement runs the
        # schedule on the arena itself, on the caller's thread, without a call into this module.
        self.split_bytes = 2 * min_bytes if count > 1 else float("inf")
        self._name = name
        self._workers: list[_Worker] = []
        self._done: queue.SimpleQueue = queue.SimpleQueue()

    def how_many(self, nbytes: int) -> int:
        """Lanes for a message of ``nbytes`` (per rank): a function of the size alone, as lanes must pair."""
        return 1 if nbytes < self.split_bytes else min(self.count, nbytes // self.min_bytes)

    def run(self, desc: int, count: int, itemsize: int, job) -> None:
        """``job(steps, lo, hi)`` over [0, count) items of ``itemsize`` bytes, split over ``how_many``
        lanes at cache-line boundaries; ``steps`` is the arena itself when one lane does it all."""
        lanes = self.how_many(count * itemsize)
        if lanes == 1:
            return job(self.arena, 0, count)
        steps = self.arena.lanes(lanes, self.count)
        barrier.barrier(self.arena, desc)  # fence: nobody still reads an earlier step of the arena
        parts = bounds(count, lanes, max(1, 64 // itemsize))

        def lane(j: int) -> None:
            try:
                job(steps[j], *parts[j])
            except ShmcollError:
                raise  # seen by every lane on every rank (a death, a mismatch, a timeout, an abort)
            except BaseException:
                # Ours alone: the same lane of the peers, and through them our other lanes, would wait
                # for this one until the timeout. Giving up makes every such wait raise within a slice.
                self.arena.abandon()
                raise

        self._start_workers(lanes - 1)
        for j in range(1, lanes):
            self._workers[j - 1].give(lambda j=j: lane(j))
        errors = []
        try:
            lane(0)
        except BaseException as error:
            errors.append((0, error))
        errors += self._collect(lanes - 1)
        if errors:
            raise _first(errors)
        self.arena.post(self.arena.next_step(), desc)  # fence: done reading every lane

    def _start_workers(self, needed: int) -> None:
        while len(self._workers) < needed:
            self._workers.append(_Worker(len(self._workers) + 1, self._done, self._name))

    def _collect(self, pending: int) -> list:
        """Wait for ``pending`` lanes of the workers; a worker's error comes back as (lane, error)."""
        errors = []
        while pending:
            try:
                lane, error = self._done.get(timeout=waits.SLICE_NS / 1e9)
            except queue.Empty:
                dead = [w.lane for w in self._workers if not w.thread.is_alive()]
                if dead:  # cannot happen short of interpreter exit; never wait for it forever
                    raise ShmcollError(f"the thread of lane(s) {dead} of {self._name} exited mid-collective")
                continue
            pending -= 1
            if error is not None:
                errors.append((lane, error))
        return errors

    def close(self) -> None:
        """Stop the lane threads (each finishes its current job first)."""
        for worker in self._workers:
            worker.give(None)
        for worker in self._workers:
            worker.thread.join(timeout=5)
        self._workers = []


def _first(errors):
    """The error to raise for a collective whose lanes failed. A failure of one lane alone (not ours:
    a bug, memory) is the cause, and what the other lanes raised after it gave up is its echo; else
    the lowest lane's (a death, a mismatch or a timeout reaches every lane alike)."""
    errors.sort(key=lambda item: (isinstance(item[1], ShmcollError), item[0]))
    lane, error = errors[0]
    if isinstance(error, ShmcollError):
        return error
    wrapped = ShmcollError(f"lane {lane} of this collective failed: {type(error).__name__}: {error}")
    wrapped.__cause__ = error
    return wrapped


class _Worker:
    """One lane's thread: runs what it is given, reports (lane, error or None), sleeps in between."""

    def __init__(self, lane: int, done: queue.SimpleQueue, name: str):
        self.lane = lane
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done = done
        self.thread = threading.Thread(target=self._loop, name=f"shmcoll-lane{lane}-{name}", daemon=True)
        self.thread.start()

    def give(self, job) -> None:
        self._jobs.put(job)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except BaseException as error:  # reported to the caller, which raises it
                self._done.put((self.lane, error))
            else:
                self._done.put((self.lane, None))
