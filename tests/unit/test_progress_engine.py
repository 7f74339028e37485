"""The progress engine's lock-free busy() (and its Backlog's idle(), which the compiled paths ask): the issuing thread must never see an idle engine while a
collective it queued is still to run or running (tests for the engine's ordering as a whole run through
torch in tests/multinode.py's mixed_order and the async scenarios)."""
import collections

from shmcoll.work import ProgressEngine


class _Watched(collections.deque):
    """A queue that records what busy() says right after the thread takes a collective off it: the
    moment a lock-free reader on the issuing thread may fall into."""

    def __init__(self, engine):
        super().__init__()
        self.engine = engine
        self.seen = []

    def popleft(self):
        item = super().popleft()
        self.seen.append((self.engine.busy(), self.engine.backlog.idle()))
        return item


def test_busy_while_the_thread_takes_a_collective_off_the_queue():
    engine = ProgressEngine("test")
    queue = engine.backlog.queue = _Watched(engine)
    try:
        for _ in range(3):
            engine.execute(lambda: None, [], True, lambda: "a queued collective").wait()
        assert queue.seen == [(True, False)] * 3  # busy, and not idle to the compiled paths (Backlog.idle)
        assert not engine.busy() and engine.backlog.idle()  # and idle again once they ran
    finally:
        engine.close()


def _engine_without_thread() -> ProgressEngine:
    """An engine whose progress thread never runs (a thread object that is never started stands in for it), so
    that only waits run what is queued."""
    import threading

    engine = ProgressEngine("test")
    engine._thread = threading.Thread(target=lambda: None)
    return engine


def test_a_wait_runs_the_queued_collectives_up_to_its_own_in_issue_order_on_its_thread():
    import threading

    engine = _engine_without_thread()
    ran = []

    def run(name):
        def body():
            ran.append((name, threading.current_thread()))
            if name == "b":
                raise RuntimeError("b failed")
        return body

    works = {name: engine.execute(run(name), [name], True, lambda: name) for name in "abc"}
    assert ran == [] and engine.busy()
    raised = []

    def wait_for_b():
        try:
            works["b"].wait()
        except RuntimeError as error:
            raised.append(str(error))

    waiter = threading.Thread(target=wait_for_b, daemon=True)  # a thread of its own: a wait that hangs fails
    waiter.start()
    waiter.join(10)
    assert not waiter.is_alive(), "the wait did not run the queued collectives (nothing else would)"
    assert raised == ["b failed"]
    assert ran == [("a", waiter), ("b", waiter)]  # a before b, on the waiting thread; c still queued
    assert works["a"].is_completed() and works["a"].is_success() and not works["c"].is_completed()
    assert works["c"].wait() and ran[2:] == [("c", threading.current_thread())]
    assert not engine.busy()


def test_a_wait_with_a_timeout_does_not_run_the_collective():
    from datetime import timedelta

    import pytest
    import torch.distributed as dist

    engine = _engine_without_thread()
    work = engine.execute(lambda: None, [], True, lambda: "a queued collective")
    with pytest.raises(dist.DistBackendError, match="did not complete within"):
        work.wait(timedelta(milliseconds=50))
    assert not work.is_completed() and engine.busy()


def test_the_future_of_an_async_work_is_made_when_asked_for_and_completes_once_either_way():
    """get_future before the collective ends, after it, or from a callback of the future itself: one future,
    completed once with the result, or with the collective's error (which value() raises). One asked for before
    the end completes, with its callbacks, on a thread other than the one that finished the collective (a
    callback may wait for a later collective, which that thread may be the one to run: completions.py)."""
    import threading

    import pytest

    from shmcoll.work import AsyncWork

    before = AsyncWork(["result"], lambda: "before")
    future = before.get_future()
    seen = []
    chained = future.then(lambda f: seen.append((f.value(), before.get_future() is future,  # asks again
                                                 threading.current_thread())))
    assert not future.done()
    before.finish()
    chained.wait()
    assert future.done() and future.value() == ["result"]
    assert seen == [(["result"], True, seen[0][2])] and seen[0][2] is not threading.current_thread()

    after = AsyncWork(["late"], lambda: "after")
    after.finish()
    assert after.get_future().value() == ["late"] and after.get_future() is after.get_future()

    failed = AsyncWork([], lambda: "failed")
    failed.finish(RuntimeError("it failed"))
    with pytest.raises(RuntimeError, match="it failed"):
        failed.get_future().value()
