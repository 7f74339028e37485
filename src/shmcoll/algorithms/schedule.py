"""Driving the C schedules (``shmcoll._schedules``, ``shmcoll._single_copy``): start one, settle slow waits, resume.

A schedule returns DONE, MISMATCH, FAILED (a single-copy read failed), SIZES
(all_to_all: the size tables disagree), or the position p of a
wait whose slice expired; position p waits for step base + p + 1, the last
step this rank posted. Python then waits the slow way (deadline, dead
peers, abandoned groups: ``Arena.wait_all``) and calls the schedule again from p.

A schedule posts its steps itself and reports, once DONE, the last step it
posted and the highest it saw every rank reach (its ``posted`` and ``reached``),
which the arena records (``Steps.record_schedule``).
"""
from shmcoll import single_copy
from shmcoll._schedules import DONE, MISMATCH, unwrapped
from shmcoll._single_copy import FAILED, SIZES
from shmcoll.descriptors import describe
from shmcoll.errors import ShmcollError
from shmcoll.waits import STEP_MASK


def run(arena, schedule, desc: int, call, sizes_error=None) -> None:
    """Run ``call(base, resume)`` (one call into ``schedule``, one of the arena's) to the end.

    ``base`` is the step before the schedule's first (every rank has reached it
    when the schedule starts). ``sizes_error()``: the exception for SIZES.
    """
    base = arena.begin_write() - 1
    finish_run(arena, schedule, desc, call, base, call(base & STEP_MASK, -1), sizes_error)


def finish_run(arena, schedule, desc: int, call, base: int, status: int, sizes_error=None) -> None:
    """The rest of ``run`` once its first call returned ``status`` (also for
    ``shmcoll._front.SmallCollectives``, which made that call)."""
    while status != DONE:
        if status == FAILED:
            raise _read_failed(arena, schedule, desc)
        if status == SIZES:  # after step base + 1, which every rank reached
            arena.record_schedule(base + 1, base + 1)
            raise sizes_error()
        step = base + 1 if status == MISMATCH else base + status + 1
        arena.record_schedule(step)
        settle(arena, status, step, desc)
        status = call(base & STEP_MASK, status)
    arena.record_schedule(unwrapped(base, schedule.posted), unwrapped(base, schedule.reached))


def settle(arena, status: int, step: int, desc: int) -> None:
    """Act on a schedule's status: raise on a mismatch, or wait (slowly) until every rank reached ``step``."""
    if status == MISMATCH:
        raise_mismatch(arena, step, desc)
    arena.wait_all(step)


def raise_mismatch(arena, step: int, desc: int, lines: int | None = None) -> None:
    """The error of a schedule (or a lane, on its ``lines``) that found a peer's ``step`` in another
    collective: naming both collectives (``Arena.check_same_collective``)."""
    arena.check_same_collective(step, desc, lines=lines)
    raise AssertionError("a schedule reported a mismatch its control lines do not show")


def _read_failed(arena, schedule, desc: int) -> ShmcollError:
    """The error of a single-copy read that failed: the peer exited (ESRCH), or its buffer is gone.

    A peer leaves a collective before the others are done reading its buffer only when the collective
    failed for it (a rank died, or it gave up on an error): name that cause, as a wait would, rather than
    the read, which is only its echo."""
    peer, code = schedule.failed_peer, schedule.failed_errno
    me, them = arena.ranks[arena.local_rank], arena.ranks[peer]
    read = f"reading rank {them}'s buffer in {describe(desc)}"
    peers = [r for r in range(arena.local_size) if r != arena.local_rank]
    try:
        arena.watch.check(peers, 0.0, arena.describe() if arena.describe else describe(desc), float("inf"))
    except ShmcollError as cause:
        return type(cause)(f"{cause} (rank {me} found out when {single_copy.failed(read, code)})")
    finally:
        arena.abandon()  # the peers must not wait for our next step until the timeout
    return single_copy.read_error(me, them, read, code)
