"""The progress engine's lock-free busy(): the issuing thread must never see an idle engine while a
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
        self.seen.append(self.engine.busy())
        return item


def test_busy_while_the_thread_takes_a_collective_off_the_queue():
    engine = ProgressEngine("test")
    queue = engine._queue = _Watched(engine)
    try:
        for _ in range(3):
            engine.execute(lambda: None, [], True, lambda: "a queued collective").wait()
        assert queue.seen == [True, True, True]
        assert not engine.busy()  # and idle again once they ran
    finally:
        engine.close()
