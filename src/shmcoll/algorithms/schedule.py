"""Driving the C schedules of ``shmcoll._reduce``: start one, settle slow waits, resume it.

A schedule returns DONE, MISMATCH, or the position p of a wait whose slice
expired; position p waits for step base + p + 1, the last step this rank
posted. Python then waits the slow way (deadline, dead peers, abandoned
groups: ``Arena.wait_all``) and calls the schedule again from p.

A schedule posts its steps itself, so the arena learns of them afterwards
(``Arena.record_schedule``): each algorithm says how many steps its schedule
takes, and whether this rank waits for everyone at the last one.
"""
from shmcoll._reduce import DONE, MISMATCH


def run(arena, desc: int, call, steps: int, last_waits_for_all: bool = True) -> None:
    """Run ``call(base, resume)`` (one call into ``arena.schedule``) to the end.

    ``base`` is the step before the schedule's first (every rank has reached it
    when the schedule starts); the schedule posts ``steps`` steps after it.
    """
    base = arena.begin_write() - 1
    status = call(base & 0xFFFFFFFF, -1)
    while status != DONE:
        step = base + 1 if status == MISMATCH else base + status + 1
        arena.record_schedule(step)
        settle(arena, status, step, desc)
        status = call(base & 0xFFFFFFFF, status)
    last = base + steps
    arena.record_schedule(last, last if last_waits_for_all else last - 1)


def settle(arena, status: int, step: int, desc: int) -> None:
    """Act on a schedule's status: raise on a mismatch, or wait (slowly) until every rank reached ``step``."""
    if status == MISMATCH:
        arena.check_same_collective(step, desc)  # raises, naming both collectives
        raise AssertionError("the schedule reported a mismatch the arena does not see")
    arena.wait_all(step)
