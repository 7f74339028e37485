"""Work objects and the per-group progress thread that completes them.

Collectives run in issue order, always. A synchronous call with nothing
queued runs inline (no thread hand-off for small messages); anything else goes
to the group's progress thread, whose hot loops release the GIL, so
``async_op=True`` overlaps communication with the caller's computation. A
caller that waits for a collective the thread has not taken yet runs it
itself (``ProgressEngine.help``).
"""
from __future__ import annotations

import collections
import threading
import time
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

from shmcoll import _state, _torch_compat, descriptors, profiling
from shmcoll._callers import caller_is
from shmcoll.completions import COMPLETIONS


def held(tensors):
    """A call's tensors as one of its Works (or its queued rest) holds them: in lists of its own, a list form's
    inner lists too. ``result()`` gives them back as the call had them, and they live as long as the Work, though a
    caller of the group's method may empty its own lists as soon as the call returns (torch's bindings pass lists
    of their own)."""
    return None if tensors is None else [list(item) if type(item) is list else item for item in tensors]


class CompletedWork(dist.Work):
    """A collective that already finished on this rank when the call returned."""

    def __init__(self, result=None, source_rank: int = -1):
        super().__init__()
        self._result = held(result) if result is not None else []
        self._source = source_rank

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self):
        return self._result

    def source_rank(self) -> int:
        return self._source

    _source_rank = source_rank  # the name torch.distributed.recv calls

    def synchronize(self) -> None:
        return None

    def get_future(self) -> torch.futures.Future:
        future = torch.futures.Future()
        future.set_result(self._result)
        return future


class _Finished:
    """``threading.Event``'s ``is_set``, ``set`` and ``wait`` for a Work's completion, set once: the Event (2 us to
    make, more to set) is made only by a waiter that must block, where most waits find the work done or run it
    themselves (``ProgressEngine.help``, ``PointToPoint.help``)."""

    __slots__ = ("_set", "_event", "_lock")

    def __init__(self):
        self._set = False
        self._event: threading.Event | None = None
        self._lock = threading.Lock()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._lock:
            self._set = True
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        with self._lock:
            if self._set:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


class AsyncWork(dist.Work):
    """A collective queued on the progress thread; completes its future there."""

    def __init__(self, result, describe: Callable[[], str], engine: ProgressEngine | None = None):
        super().__init__()
        self._result = held(result)
        self._describe = describe  # what the collective is, for a timeout's message: asked only then (a microsecond)
        self._engine = engine  # whose queue it waits in (None: finished when made)
        self._done = _Finished()
        self._error: BaseException | None = None
        # The future c10 sees is completed through then(): where the collective failed, the callback
        # raises, and that completes the future with an *error* the way c10 futures carry one (value()
        # rethrows it, in C++ too). Future.set_exception would complete it with the exception as its
        # value, which C++ consumers take for the result: DDP's reducer read it as the reduced tensors
        # and crashed (SIGSEGV in parseCppCommHookResult) where it should raise from backward().
        # Both are made when first asked for (``get_future``: DDP's reducer asks, a wait does not; making
        # them and completing them cost 5-10 us a collective).
        self._completion: torch.futures.Future | None = None
        self._future: torch.futures.Future | None = None
        self._future_completed = False  # set_result called, or about to be, by finish() or get_future()
        self._source = -1
        self._event = None  # a profiler event to end with the work (``ends``)
        self._lock = threading.Lock()  # the profiler event and the future, which finish() and the caller race for

    def _outcome(self, _completion):
        if self._error is not None:
            raise self._error
        return self._result

    def _claim_completion(self) -> torch.futures.Future | None:
        """The future to complete now (the lock held), once: where it was made and the work is done."""
        if self._completion is None or self._future_completed or not self._done.is_set():
            return None
        self._future_completed = True
        return self._completion

    # -- called by the progress thread ----------------------------------------

    def finish(self, error: BaseException | None = None, source_rank: int | None = None) -> None:
        if source_rank is not None:
            self._source = source_rank
        self._error = error
        self._done.set()
        self._end_event()
        with self._lock:
            completion = self._claim_completion()
        if completion is not None:  # its callbacks may wait for a later collective: not on this thread
            COMPLETIONS.complete(completion)

    @property
    def ended(self) -> bool:
        """Whether ``finish`` has run: what its engine asks, which, unlike torch's ``is_completed``, nothing
        overrides to do more (a transfer's Work wakes its thread when asked that)."""
        return self._done.is_set()

    def ends(self, event) -> None:
        """End profiler ``event`` (``shmcoll.profiling``) when this work finishes, or now if it has."""
        self._event = event
        if self._done.is_set():
            self._end_event()

    def _end_event(self) -> None:
        with self._lock:  # finish() and ends() may race: one of them ends it
            event, self._event = self._event, None
        profiling.end(event)

    # -- torch.distributed.Work -------------------------------------------------

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        seconds = timeout.total_seconds() if timeout else 0
        if seconds <= 0 and self._engine is not None and not self._done.is_set():
            self._engine.help(self)
        if not self._done.wait(seconds if seconds > 0 else None):
            raise dist.DistBackendError(f"Timed out: {self._describe()} did not complete within {seconds:g} s "
                                         f"(Work.wait timeout)")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.wait()
        return self._result

    def source_rank(self) -> int:
        self.wait()
        return self._source

    _source_rank = source_rank  # the name torch.distributed.recv calls

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        with self._lock:
            if self._future is None:
                self._completion = torch.futures.Future()
                self._future = self._completion.then(self._outcome)
            future, completion = self._future, self._claim_completion()
        if completion is not None:
            completion.set_result(None)
        return future


class WritingBack(dist.Work):
    """The Work of a call whose outputs were stand-ins (``shmcoll.staging.resolved``: the caller's tensors are
    lazily negated or conjugated views; or a receive's tensor is not contiguous): ``work``, the stand-ins' own,
    and once it is done, each stand-in copied into the caller's tensor (``pairs``: (tensor, stand-in)), before
    anything sees it done. A call that finished already is copied back at once; else the first question that
    finds it done does it (``wait``, ``is_completed``, its future), on the thread that asks."""

    def __init__(self, work, pairs, result):
        super().__init__()
        self._work = work
        self._pairs = pairs  # until copied back: then nothing of the call is kept
        self._result = held(result)
        self._lock = threading.Lock()
        if work.is_completed():
            self._write_back()

    def _write_back(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, None
            if pairs is not None and self._work.is_success():
                for tensor, stand_in in pairs:
                    tensor.copy_(stand_in)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        done = self._work.wait(timeout) if timeout else self._work.wait()
        self._write_back()
        return done

    def is_completed(self) -> bool:
        if not self._work.is_completed():
            return False
        self._write_back()
        return True

    def is_success(self) -> bool:
        return self.is_completed() and self._work.is_success()

    def exception(self):
        return self._work.exception()

    def result(self):
        self.wait()
        return self._result

    def source_rank(self) -> int:
        return self._work.source_rank()

    _source_rank = source_rank  # the name torch.distributed.recv calls

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        def written(future):
            future.value()  # raises the call's error
            self._write_back()
            return self._result

        return self._work.get_future().then(written)


def ending(work, event):
    """``work``, whose completion ends profiler ``event``: an AsyncWork's finish, else now (a Work that is
    done, or one of Gloo's, which records its own events)."""
    if event is not None:
        if isinstance(work, AsyncWork):
            work.ends(event)
        else:
            profiling.end(event)
    return work


class ProgressEngine:
    """Runs one group's collectives in issue order, inline or on a daemon thread."""

    def __init__(self, name: str):
        self._name = name
        self._cv = threading.Condition(threading.Lock())
        self._waiters = 0  # threads blocked in abort() until nothing runs
        self._idle = False  # the progress thread is blocked until there is work for it
        # Queued collectives, whether one executes (inline or on the thread), whether closed: what the compiled
        # small collectives ask too (``Backlog.idle``); changed under ``_cv``.
        self.backlog = _state.Backlog(collections.deque())
        self._thread: threading.Thread | None = None
        self.on_thread = False  # the collective running now runs on the progress thread
        self._completed = CompletedWork()  # see completed(): holds nothing

    def busy(self) -> bool:
        """Something is queued or running. Read without the lock, the queue first (``Backlog.idle`` says why)."""
        backlog = self.backlog
        return bool(backlog.queue) or backlog.running

    def completed(self, result, source: int | None = None) -> CompletedWork:
        """The Work of a synchronous call that finished inline.

        torch's own wrappers (``dist.all_reduce`` and the rest) wait for a synchronous Work and drop it: they
        get the engine's one completed Work, which holds nothing, since making a Work (a pybind11 object) costs
        more than the rest of an 8-byte collective's own work. Any other caller (the group's method called
        directly) may keep its Work and ask for its result: it gets one of its own (``shmcoll._callers``).
        """
        if caller_is(_torch_compat.COLLECTIVE_WRAPPERS):
            return self._completed
        return CompletedWork(result, -1 if source is None else source)

    @property
    def shared_completed(self) -> CompletedWork:
        """The one completed Work that ``completed`` hands torch's wrappers (the compiled small collectives hand
        it out by the same rule, in C)."""
        return self._completed

    @staticmethod
    def finished(result, desc: int, error: BaseException | None = None) -> dist.Work:
        """The Work of an asynchronous call that ran inline (where it waits for no peer): a completed one of its
        own (the caller may keep several and wait for them later), or one failed with ``error`` as one on the
        progress thread fails (``wait()`` and its future raise it)."""
        if error is None:
            return CompletedWork(result)
        work = AsyncWork(result, lambda: descriptors.describe(desc))
        work.finish(error)
        return work

    def execute(self, run, result, async_op: bool, describe):
        """Run ``run()`` (which may return a source rank) in order; return its Work (``describe()``: what it is,
        for a timeout's message)."""
        backlog = self.backlog
        with self._cv:
            inline = not async_op and not backlog.running and not backlog.queue
            if inline:
                backlog.running = True
        if inline:
            try:
                source = run()
            finally:
                with self._cv:
                    self._ended()
            return self.completed(result, source)
        work = AsyncWork(result, describe, self)
        with self._cv:
            if backlog.closed:
                raise dist.DistBackendError(f"{self._name}: this process group was shut down or aborted")
            backlog.queue.append((run, work))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"shmcoll-progress-{self._name}",
                                                daemon=True)
                self._thread.start()
            if self._idle:
                self._cv.notify_all()
        if not async_op:
            work.wait()
        return work

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self.backlog.queue or self.backlog.running:
                    if self.backlog.closed and not self.backlog.queue:
                        return
                    self._idle = True
                    self._cv.wait()
                    self._idle = False
                self.backlog.running = True  # before the queue shrinks: see busy()
                run, work = self.backlog.queue.popleft()
            self._run_taken(run, work, on_thread=True)
            # Idle for long maybe: keep no collective's closure (its tensors) or Work alive meanwhile.
            del run, work

    def help(self, work: AsyncWork) -> None:
        """Run on this thread, in issue order, the queued collectives up to ``work`` that the progress thread has
        not taken: a thread that waits computes nothing meanwhile, so handing them to the progress thread, whose
        waits sleep at once (``waits.policy``), and being woken by it would only delay it (an ``async_op=True``
        call waited for at once; a functional collective and its ``wait_tensor``). The rest, and a wait with a
        timeout, wait for the progress thread, which never helps."""
        if threading.current_thread() is self._thread:
            return
        while True:
            with self._cv:
                if self.backlog.running or not any(queued is work for _, queued in self.backlog.queue):
                    return  # running, finished, or failed by abort(): it completes elsewhere
                self.backlog.running = True  # before the queue shrinks: see busy()
                run, taken = self.backlog.queue.popleft()
            self._run_taken(run, taken, on_thread=False)
            if taken is work:
                return

    def _run_taken(self, run, work: AsyncWork, on_thread: bool) -> None:
        """Run a collective taken off the queue (``backlog.running`` set), and finish its Work."""
        self.on_thread = on_thread
        try:
            source = run()
            error = None
        except BaseException as exc:  # delivered to the waiter, never lost
            source, error = None, exc
        self.on_thread = False
        with self._cv:
            self._ended()
        work.finish(error, source)

    def _ended(self) -> None:
        """The collective running now has ended (the lock held): wake whoever that concerns, and nobody else
        (a wake-up of the idle progress thread costs the cores a context switch and the GIL a hand-off)."""
        self.backlog.running = False
        if self._waiters or (self._idle and self.backlog.queue):
            self._cv.notify_all()

    def close(self) -> None:
        """Finish queued work, then stop the thread."""
        with self._cv:
            self.backlog.closed = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def abort(self, error: BaseException, grace_s: float) -> bool:
        """Fail every queued collective with ``error``, refuse new ones, and wait up to ``grace_s`` for the
        one running now, on any thread (its waits raise once the placement is aborted). Returns whether
        nothing runs any more."""
        with self._cv:
            self.backlog.closed = True
            queued, self.backlog.queue = list(self.backlog.queue), collections.deque()
            self._cv.notify_all()
        for _, work in queued:
            work.finish(error)
        deadline = time.monotonic() + grace_s
        with self._cv:
            while self.backlog.running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._waiters += 1
                self._cv.wait(left)
                self._waiters -= 1
        self.close()  # the thread, now idle, exits
        return True
