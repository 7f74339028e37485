"""Where a Work's future completes, and with it the callbacks chained on it: on a thread of its own.

A future's ``then`` callbacks run on the thread that completes it, and may issue collectives and wait for them
(torch's PowerSGD DDP hook does: ``all_reduce(..., async_op=True).get_future().wait()`` inside a callback). Had
the thread that finished the collective completed its future (a group's progress thread, or the point-to-point
thread, which holds its engine's lock there), the wait would wait for that very thread: a hang. So the thread
that finishes a collective whose future was asked for hands the completion here, and goes on.

Each completion has a thread free to run it: one waiting for work, else a new one (where every thread runs a
callback that waits, as nested callbacks do); a thread that found nothing to do for ``IDLE_EXIT_S`` ends.
"""
from __future__ import annotations

import collections
import os
import threading

import torch

IDLE_EXIT_S = 10.0  # how long a completion thread waits for work before it ends


class Completions:
    """Runs ``future.set_result(None)`` for each future handed to ``complete``, never on the caller's thread."""

    def __init__(self):
        self._cv = threading.Condition(threading.Lock())
        self._queue: collections.deque = collections.deque()
        self._waiting = 0  # threads waiting for a completion to run

    def complete(self, future: torch.futures.Future) -> None:
        with self._cv:
            self._queue.append(future)
            # Every queued completion must have a thread of its own: one that waits, or a new one. A waiting
            # thread counts until it runs again, so two completions queued at once never share one (the first
            # one's callbacks may wait for the second).
            if len(self._queue) > self._waiting:
                threading.Thread(target=self._serve, name="shmcoll-completions", daemon=True).start()
            else:
                self._cv.notify()

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._waiting += 1
                    woken = self._cv.wait(IDLE_EXIT_S)
                    self._waiting -= 1
                    if not woken and not self._queue:
                        return
                future = self._queue.popleft()
            future.set_result(None)
            del future  # while waiting, keep no Work's outcome (its tensors) alive

    def _after_fork(self) -> None:
        """A forked child has none of the parent's threads: none waits."""
        self._cv = threading.Condition(threading.Lock())
        self._queue = collections.deque()
        self._waiting = 0


COMPLETIONS = Completions()
os.register_at_fork(after_in_child=COMPLETIONS._after_fork)
