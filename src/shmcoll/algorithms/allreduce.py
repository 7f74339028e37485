"""All-reduce: one-shot for small messages, chunked reduce-scatter + all-gather for large.

Both run as one call into ``shmcoll._reduce`` (copies, steps, waits and the
kernel, without the GIL); Python only steps in when a wait outlasts its slice,
to check the deadline and the peers' liveness, and then resumes the schedule.
Both reduce the L contributions in rank order (row 0 first), so every rank,
and both algorithms, produce bitwise identical results.
"""
from shmcoll._reduce import DONE
from shmcoll.algorithms import schedule


def one_shot(arena, addr: int, count: int, itemsize: int, kernel: int, op: int, scale: float, desc: int) -> None:
    """Everyone publishes its whole input (at most one slot), then reduces all slots into its output."""
    step = arena.begin_write()
    status = arena.schedule.one_shot(step & 0xFFFFFFFF, desc, addr, count, itemsize, kernel, op, scale, False)
    arena.record_schedule(step)
    while status != DONE:
        schedule.settle(arena, status, step, desc)
        status = arena.schedule.one_shot(step & 0xFFFFFFFF, desc, addr, count, itemsize, kernel, op, scale, True)
    arena.record_schedule(step, step)


def reduce_scatter_allgather(arena, addr: int, count: int, itemsize: int, kernel: int, op: int, scale: float,
                             desc: int, root: int | None = None) -> None:
    """Per chunk: publish it, reduce our 1/L share of it, publish that, gather the others' shares.

    With ``root``, only that rank gathers (a reduce); the others leave once their share is published.
    """
    root = -1 if root is None else root
    chunked = arena.schedule.chunked
    schedule.run(arena, arena.schedule, desc, lambda base, resume: chunked(base, desc, addr, count, itemsize, kernel,
                                                                           op, scale, root, resume))


def single_copy(arena, addr: int, count: int, itemsize: int, kernel: int, op: int, scale: float, desc: int,
                root: int | None = None) -> None:
    """All-reduce in place, each rank reading its share of the others' buffers and then the others' shares
    where they are (``_single_copy``): the same kernel in the same rank order, so the same bits. With
    ``root``: a reduce, the root reading every buffer whole."""
    sc = arena.single_copy
    if root is not None:
        return schedule.run(arena, sc, desc, lambda base, resume: sc.reduce(base, desc, addr, count, itemsize, root,
                                                                             kernel, op, scale, resume))
    schedule.run(arena, sc, desc, lambda base, resume: sc.allreduce(base, desc, addr, count, itemsize, kernel, op,
                                                                     scale, resume))
