"""All-reduce: one-shot for small messages; above, one-shot steps of a slot each between two ranks, chunked
reduce-scatter + all-gather between more.

Both run as one call into ``shmcoll._schedules`` (copies, steps, waits and the
kernel, without the GIL); Python only steps in when a wait outlasts its slice,
to check the deadline and the peers' liveness, and then resumes the schedule.
Both reduce the L contributions in rank order (row 0 first), so every rank,
and both algorithms, produce bitwise identical results.
"""
from shmcoll._schedules import DONE
from shmcoll.algorithms import schedule
from shmcoll.descriptors import BEYOND_ANY_MESSAGE
from shmcoll.waits import STEP_MASK

# The one-shot's reads grow with the ranks (each reads every rank's input) while the chunked schedule's do not:
# beyond 4 ranks its limit falls with the square of the ranks (an estimate from 2 x 8 to 16 x 1 ranks on 16 cores,
# where a 64 KiB one-shot took longer than a 256 KiB chunked all-reduce: BENCHMARKS.md, "Threads per rank").
ONE_SHOT_RANKS_BYTES = 1 << 20


# Between two ranks every all-reduce is one-shot, in steps of one slot above the one-step limit: each rank reads
# the other's whole input either way (the chunked schedule reads its half to reduce and the other's half of the
# result), so one-shot steps copy no more and meet once per chunk instead of twice. On the 2-core AMD VM
# all-reduces of 512 KiB-8 MiB ran 1.5-1.9x faster so (docs/benchmark-log.md, "All-reduce between two ranks").
# A rank's lanes keep the chunked schedule: on 16 cores a one-shot per lane lost to it at 2 x 8 for bfloat16,
# whose kernel is the dearer part there (BENCHMARKS.md, "Threads per rank").
ONE_SHOT_STEPS_RANKS = 2


def one_shot_steps_apply(local_size: int, lanes: int) -> bool:
    """Whether all-reduces above the one-step limit run in one-shot steps (``one_shot_steps``) rather than
    chunked: between ``ONE_SHOT_STEPS_RANKS`` ranks that have one lane each."""
    return local_size <= ONE_SHOT_STEPS_RANKS and lanes < 2


def one_shot_limit(small_bytes: int, chunk_bytes: int, local_size: int, lanes: int = 1,
                   split_bytes: int = BEYOND_ANY_MESSAGE, lane_share_bytes: int = 0) -> int:
    """The largest all-reduce (bytes) that runs as one step: SHMCOLL_SMALL_BYTES, within one slot, and within
    ONE_SHOT_RANKS_BYTES / local_size^2 per thread.

    Where messages from ``split_bytes`` on are cut into up to ``lanes`` lanes (``shmcoll.lanes``), a one-shot
    that splits divides its reads among them, so the ranks' cap grows with the lanes (``lanes`` x
    ONE_SHOT_RANKS_BYTES / local_size^2), and every lane's even share must fit its slots (at most
    ``lane_share_bytes``). SHMCOLL_SMALL_BYTES stays the most: its default keeps the split one-shot where the
    16-core machine measured it (up to 64 KiB) since one step per lane up to T x 64 KiB lost to two steps per
    chunk at 4 x 4 (256 KiB: 2.3-2.9x slower) and for bfloat16 at 2 x 8 (docs/benchmark-log.md, "The one-shot
    over lanes, tried and dropped"): a one-shot reduces the whole message on every rank where the chunked
    schedule reduces 1/L of it. A larger SHMCOLL_SMALL_BYTES raises it up to that cap (``bench/threads.sh``,
    part ``oneshot``, measures where it pays)."""
    per_thread = ONE_SHOT_RANKS_BYTES // (local_size * local_size)
    alone = min(small_bytes, chunk_bytes, per_thread)
    if lanes < 2 or alone < split_bytes:
        return alone  # no one-shot is split (one between the two limits would run on one thread)
    # Shares run up to split_bytes just above it (two lanes), and up to the limit / lanes at the top.
    if lane_share_bytes < split_bytes:
        return split_bytes - 1  # no one-shot is split
    return min(small_bytes, lanes * per_thread, lanes * lane_share_bytes)


def one_shot(arena, addr: int, count: int, itemsize: int, kernel: int, op: int, scale: float, desc: int) -> None:
    """Everyone publishes its whole input (at most one slot), then reduces all slots into its output."""
    step = arena.begin_write()
    status = arena.schedule.one_shot(step & STEP_MASK, desc, addr, count, itemsize, kernel, op, scale, False)
    finish_one_shot(arena, step, status, desc, addr, count, itemsize, kernel, op, scale)


def finish_one_shot(arena, step: int, status: int, desc: int, addr: int, count: int, itemsize: int, kernel: int,
                    op: int, scale: float) -> None:
    """The rest of a one-shot whose first call into the schedule returned ``status``: settled and resumed
    until DONE, then recorded (also for ``shmcoll._front.SmallCollectives``, which made that first call)."""
    if status != DONE:  # a wait outlasted its slice, or a peer is in another collective
        arena.record_schedule(step)
        while status != DONE:
            schedule.settle(arena, status, step, desc)
            status = arena.schedule.one_shot(step & STEP_MASK, desc, addr, count, itemsize, kernel, op, scale, True)
    arena.record_schedule(step, step)


def one_shot_steps(arena, addr: int, count: int, itemsize: int, kernel: int, op: int, scale: float,
                   desc: int) -> None:
    """Per chunk of a slot: everyone publishes it whole, then reduces every rank's copy into its output."""
    steps = arena.schedule.one_shot_steps
    schedule.run(arena, arena.schedule, desc, lambda base, resume: steps(base, desc, addr, count, itemsize, kernel,
                                                                         op, scale, resume))


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
                root: int | None = None, lanes: int = 1) -> None:
    """All-reduce in place, each rank reading its share of the others' buffers and then the others' shares
    where they are (``_single_copy``), over ``lanes`` of its lanes: the same kernel in the same rank order,
    so the same bits. With ``root``: a reduce, the root reading every buffer whole."""
    sc = arena.single_copy
    if root is not None:
        return schedule.run(arena, sc, desc, lambda base, resume: sc.reduce(base, desc, addr, count, itemsize, root,
                                                                             kernel, op, scale, lanes, resume))
    schedule.run(arena, sc, desc, lambda base, resume: sc.allreduce(base, desc, addr, count, itemsize, kernel, op,
                                                                     scale, lanes, resume))
