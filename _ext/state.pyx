# cython: language_level=3
"""The running state that every path of a group shares, compiled or not (declared in state.pxd).

A group's bookkeeping (``GroupState``), the arena's step count (``StepCount``), what an engine has queued
(``Backlog``) and whether DEBUG logging is on (``DebugSwitch``) are read on the compiled small collectives'
path at every call, where a Python attribute lookup or method call is a measurable share of an 8-byte
collective; here they are C fields and C methods that the Python modules use through the same names.
"""
import logging

cdef int _DEBUG = logging.DEBUG


cdef class StepCount:
    """Where a sequence of steps stands on this rank: the last step it posted (``step``) and the highest every
    local rank is known to have reached (``all_reached``). ``shmcoll.arena.Steps`` derives from it, so that the
    compiled small collectives (front.pxi) read and write both as C fields, not Python attributes."""


cdef class GroupState:
    """A group's state that every collective updates (``shmcoll.collectives.Collectives``), in C so that the
    compiled small collectives (front.pxi) update it without Python attribute lookups: collectives started
    (``seq``) and the one in progress (``desc``), for messages; whether one runs now (``in_collective``:
    teardown must not unmap the arena under it); the first failure (``error``), after which the group
    refuses collectives."""


cdef class Backlog:
    """What an engine has taken on and not finished: its queued work (``queue``, a deque or a list, in issue
    order), whether it runs one now (``running``) and whether it refuses more (``closed``). Its engine
    (``shmcoll.work.ProgressEngine``, ``shmcoll.p2p.PointToPoint``) changes it under its own lock; a compiled
    path asks ``idle()`` before it runs a call itself, which it may only do with nothing before it."""

    def __init__(self, queue):
        self.queue = queue

    cpdef bint idle(self):
        """Nothing queued, nothing running, and open. Read without the engine's lock by the thread that issues
        (only it queues, so from its point of view an idle engine stays idle). The queue is read first: its
        engine marks itself running before it takes work off the queue (``ProgressEngine._loop``), so no moment
        between the two reads shows neither. Read the other way round, a collective taken off the queue just
        then would be missed, and a synchronous call issued after it would run alongside it (an all_gather
        reading its input before the asynchronous all_reduce issued before it had written it)."""
        return not self.queue and not self.running and not self.closed


cdef class DebugSwitch:
    """Whether ``log`` records DEBUG messages: what the compiled paths ask before a call they would run without
    logging it (the general path logs each collective at DEBUG). ``Logger.isEnabledFor``, whose answer
    follows every change of level anywhere in the logger's hierarchy."""

    def __init__(self, log):
        self.is_enabled_for = log.isEnabledFor

    cpdef bint on(self):
        return self.is_enabled_for(_DEBUG)
