"""All-reduce: one-shot for small messages, chunked reduce-scatter + all-gather for large.

Both run as one call into ``shmcoll._reduce`` (copies, steps, waits and the
kernel, without the GIL); Python only steps in when a wait outlasts its slice,
to check the deadline and the peers' liveness, and then resumes the schedule.
Both reduce the L contributions in rank order (row 0 first), so every rank,
and both algorithms, produce bitwise identical results.
"""
from shmcoll._reduce import DONE, MISMATCH


def one_shot(arena, addr: int, count: int, itemsize: int, kernel: int, op: int, scale: float, desc: int) -> None:
    """Everyone publishes its whole input (at most one slot), then reduces all slots into its output."""
    step = arena.begin_write()
    status = arena.schedule.one_shot(step & 0xFFFFFFFF, desc, addr, count, itemsize, kernel, op, scale, False)
    arena.step = step
    while status != DONE:
        settle(arena, status, step, desc)
        status = arena.schedule.one_shot(step & 0xFFFFFFFF, desc, addr, count, itemsize, kernel, op, scale, True)
    arena.all_reached = step


def reduce_scatter_allgather(arena, addr: int, count: int, itemsize: int, kernel: int, op: int, scale: float,
                             desc: int, root: int | None = None) -> None:
    """Per chunk: publish it, reduce our 1/L share of it, publish that, gather the others' shares.

    With ``root``, only that rank gathers (a reduce); the others leave once their share is published.
    """
    base = arena.begin_write() - 1
    chunks = -(-count * itemsize // arena.chunk_bytes)
    root = -1 if root is None else root
    schedule = arena.schedule
    status = schedule.chunked(base & 0xFFFFFFFF, desc, addr, count, itemsize, kernel, op, scale, root, -1)
    while status != DONE:
        # Position p waits for step base + p + 1, the last one this rank posted.
        step = base + 1 if status == MISMATCH else base + status + 1
        arena.step = step
        settle(arena, status, step, desc)
        status = schedule.chunked(base & 0xFFFFFFFF, desc, addr, count, itemsize, kernel, op, scale, root, status)
    arena.step = base + 2 * chunks
    arena.all_reached = arena.step if root in (-1, arena.local_rank) else arena.step - 1


def settle(arena, status: int, step: int, desc: int) -> None:
    """Act on a schedule's status: raise on a mismatch, or wait (slowly) until every rank reached ``step``."""
    if status == MISMATCH:
        arena.check_same_collective(step, desc)  # raises, naming both collectives
        raise AssertionError("the schedule reported a mismatch the arena does not see")
    arena.wait_all(step)
