"""What torch's profiler shows of the collectives: one event each, as it shows Gloo's.

Every collective and point-to-point call records an event named for the backend
and the collective (``shm:all_reduce``, ``shm:all_gather``, ... as Gloo's are
``gloo:all_reduce``), with its input tensors (their shapes and dtypes when the
profiler records shapes) and the collective's metadata (its kind, the elements
or bytes of its message, dtype, root, group size).

The event starts on the thread that issued the call and ends when the
collective has run, wherever it ran: torch's profiler records the events of the
thread that started it (and of the threads it hands its state to), not those of
the progress thread, so an ``async_op=True`` collective's event spans its issue
to its completion, as Gloo's does. Where no profiler is active nothing is
recorded, at the cost of one check (~0.1 us).

Both come from torch's internals (``_profiler_enabled``, ``_RecordFunctionFast``, as
torch's own Python records its fast events). On a torch without them, or whose event
takes other arguments, nothing is recorded at all: ``unavailable`` says why, and
``torch_internals`` logs it once and ``python -m shmcoll info`` lists it.
"""
from __future__ import annotations

from shmcoll import descriptors


def _never() -> bool:
    return False


def _probe():
    """torch's (is a profiler on, event type), or (never, None) and why not: an event made as ``_begin`` makes
    them, not entered, so a changed signature shows here and not in a collective's call."""
    try:
        from torch._C._autograd import _profiler_enabled
        from torch._C._profiler import _RecordFunctionFast

        _RecordFunctionFast("shm:probe", [], {"Group size": 1})
    except (ImportError, TypeError, RuntimeError) as error:
        return _never, None, f"{type(error).__name__}: {error}"
    return _profiler_enabled, _RecordFunctionFast, None


_profiler_enabled, _RecordFunctionFast, unavailable = _probe()
active = _profiler_enabled  # whether a profiler is on (callers that skip start() when not: one call less)

# "shm:<kind>" for each descriptor kind, made once.
_NAMES = {kind: f"shm:{name}" for kind, name in descriptors.KIND_NAMES.items()}


def start(desc: int, inputs, group_size: int):
    """The event of collective ``desc`` (``inputs``: its input tensors), begun now; None when no profiler is
    active. ``end`` it once the collective has run."""
    if not _profiler_enabled():
        return None
    kind, what = descriptors.fields(desc)
    return _begin(_NAMES[kind], list(inputs), {**what, "Group size": group_size})


def start_p2p(kind: str, tensor, peer: int | None, tag: int, group_size: int):
    """The event of a point-to-point call (``kind``: "send" or "recv"); None when no profiler is active."""
    if not _profiler_enabled():
        return None
    return _begin(f"shm:{kind}", [tensor], {"Peer": -1 if peer is None else peer, "Tag": tag,
                                            "Group size": group_size})


def _begin(name: str, inputs: list, metadata: dict):
    event = _RecordFunctionFast(name, inputs, metadata)
    event.__enter__()
    return event


def end(event) -> None:
    if event is not None:
        event.__exit__(None, None, None)
