"""How a large message flows through the stages of a plan: in segments, node and network overlapped."""
from __future__ import annotations

from collections import deque

# A message flows in segments of SHMCOLL_SEGMENT_BYTES (``Shape.segment_bytes``): each segment's
# network stage runs on Gloo's threads while this thread runs the node stages of the next and of the
# one before. Network stages in flight at once: one on the link while the next is prepared.
DEPTH = 2


def segments(total: int, per_segment: int) -> list[tuple[int, int]]:
    """[lo, hi) cuts of ``total`` items, ``per_segment`` each (the last may be shorter); none for 0."""
    per_segment = max(1, per_segment)
    return [(lo, min(total, lo + per_segment)) for lo in range(0, total, per_segment)]


def run(link, cuts, before, network, after) -> None:
    """For each cut, in order: ``before(cut)`` (a node stage), ``network(cut)`` (a Pending of ``link``, or
    None), and, once that network stage is done, ``after(cut)``; at most DEPTH network stages in flight.
    Every rank runs the node stages in the same order, as the arena requires."""
    in_flight = deque()
    for cut in cuts:
        before(cut)
        in_flight.append((cut, network(cut)))
        if len(in_flight) == DEPTH:
            _finish(link, *in_flight.popleft(), after)
    while in_flight:
        _finish(link, *in_flight.popleft(), after)


def _finish(link, cut, pending, after) -> None:
    if pending is not None:
        link.wait(pending)
    after(cut)
