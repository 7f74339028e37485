"""Every wait of shmcoll on its peers goes through here: one policy, one set of checks.

The fast part of a wait is Cython (``_sync.wait_rank``/``wait_ranks``, and the
C schedules of ``_schedules``): spin with a pause instruction for the spin
budget, loop on ``sched_yield`` for the yield budget, then sleep on the futex
of the awaited step word — for at most one *slice* (``SLICE_NS``). When a
slice ends with the peers still behind, the wait comes back to Python, to
``Watch.check``, which decides in one place whether to go on waiting:

  aborted    ``abort()`` was called on the group (from any thread): raise now
  dead       an awaited peer's process exited (a zombie counts as dead: a
             launcher that reaps its ranks in order leaves one looking alive)
  gave up    an awaited peer gave up mid-collective after an error of its own
  left       an awaited peer closed the group (destroy_process_group, abort())
  timed out  the group's timeout passed since the wait began
  slow       warn (WARNING log) after 10 s, or a third of the timeout, then
             each time the wait doubles

Collective steps (``Arena``) and point-to-point channels (``p2p``) use the
same ``Watch``, so a fix to liveness or wording is made once.
"""
from __future__ import annotations

import os
import time
from typing import NamedTuple

from shmcoll import _sync
from shmcoll._logging import first_wait_warning, log
from shmcoll.errors import AbortedError, PeerDiedError, PeerGaveUpError, PeerLeftError, PeerTimeoutError

# How long one wait call may block before Python checks deadline, liveness and abort.
SLICE_NS = 100_000_000
# Step words are 32 bits (the futex word); Python counts steps in unbounded integers and hands C their low bits.
STEP_MASK = 0xFFFFFFFF

# A rank's standing in its group, which it posts in its control line (``Arena.abandon``, ``Arena.close``): it takes
# part; it gave up mid-collective after an error; it closed the group. After either of the last two it takes no
# further step, and a peer that waits for one raises (``Watch.check``).
IN_GROUP, GAVE_UP, LEFT = 0, 1, 2


class Budgets(NamedTuple):
    """How a wait spends its first slice before it sleeps on the futex (``Policy`` decides)."""
    spin_ns: int  # busy-spin with a pause instruction
    yield_ns: int  # then loop on sched_yield
    # Yield only while another local rank last waited on this rank's CPU, else sleep at once (where local
    # ranks outnumber the cores: alone on its core a rank's yields return at once, and the core it holds
    # is one the kernel could move a rank of a crowded core to; _ext/lines.pxi, _wait_ranks).
    yield_if_shared: bool = False

    def company(self, local_size: int) -> int:
        """The waits' ``yield_company`` (_ext/lines.pxi): how many ranks' CPUs a wait compares with its own
        before it yields, 0 where it yields regardless."""
        return local_size if self.yield_if_shared else 0


SLEEP_AT_ONCE = Budgets(0, 0)

# How long an idle lane thread polls for the next collective before it sleeps: a burst (DDP's buckets, a
# tensor-parallel layer's all-reduces) finds it awake, and an idle group holds no core for longer.
LANE_IDLE_SPIN_NS = 50_000


def lane_budgets(budgets: Budgets, oversubscribed: bool) -> Budgets:
    """The budgets of a lane's waits: the arena's, but no spin where the node's lane threads outnumber the
    cores (a spinning lane would hold the core its peer's lane needs)."""
    return budgets._replace(spin_ns=0) if oversubscribed else budgets


def lane_idle_spin_ns(oversubscribed: bool) -> int:
    """How long an idle lane thread polls before it sleeps: not at all where the node's lane threads
    outnumber the cores (its poll would take the core from a thread with work)."""
    return 0 if oversubscribed else LANE_IDLE_SPIN_NS


class Policy(NamedTuple):
    """The budgets of every wait on one arena, decided once (``policy``): a collective the caller's thread
    runs (``inline``), one on the progress thread (``background``)."""
    inline: Budgets
    background: Budgets

    def apply(self, arena, background: bool) -> None:
        """Give ``arena`` (None: no arena) the budgets of the collectives that follow."""
        if arena is not None:
            arena.set_waits(self.background if background else self.inline)

    def describe(self) -> str:
        spin_ns, yield_ns, if_shared = self.inline
        shared = " while another local rank shares the core" if if_shared else ""
        return (f"  waits: spin {spin_ns / 1000:g} us, sched_yield {yield_ns / 1000:g} us{shared}, then futex sleep "
                f"({len(os.sched_getaffinity(0))} usable CPUs); on the progress thread: "
                f"{'the same' if self.background == self.inline else 'futex sleep at once'}")


def policy(settings, local_size: int, across_nodes: bool) -> Policy:
    """The wait policy of a rank whose node has ``local_size`` ranks (``across_nodes``: in a group of several).

    Inline, where nothing else wants the core: a pure spin reacts fastest but holds the core; a sched_yield
    loop is almost as quick when the core is otherwise idle and hands the core over when a peer (or anything
    else) is runnable on it. So: a short spin, unless local ranks outnumber cores, then yields, then the
    futex sleep. Where they outnumber the cores, a rank yields only while another shares its core: the kernel
    leaves three ranks on one of two cores for tens of milliseconds when the fourth yields on the other, a
    few when it sleeps (4 ranks on 2 cores, 256 KiB: 8-24% off the median of all_reduce, all_gather,
    reduce_scatter and broadcast over 6 job pairs, BENCHMARKS "More ranks than cores").

    Sleep at once otherwise. An asynchronous collective runs while the caller computes, typically on the
    same cores (DDP's backward): spinning or yielding there takes cycles from the computation it overlaps
    (DDP, 2 ranks on 2 cores: communication overhead per step 50-53 -> 42-44 ms). A collective across nodes
    costs at least one network round (tens of microseconds or more), so a futex wake-up is noise there, and
    a rank that spins or yields takes the core from the peer, or the Gloo thread, it waits for.

    Explicit SHMCOLL_SPIN_US / SHMCOLL_YIELD_US apply everywhere.
    """
    oversubscribed = local_size > len(os.sched_getaffinity(0))
    explicit = settings.spin_us is not None or settings.yield_us is not None
    spin_us = settings.spin_us if settings.spin_us is not None else (0.0 if oversubscribed else 20.0)
    yield_us = settings.yield_us if settings.yield_us is not None else (200.0 if oversubscribed else 500.0)
    chosen = Budgets(int(spin_us * 1000), int(yield_us * 1000), oversubscribed)
    if explicit:
        return Policy(chosen, chosen)
    return Policy(SLEEP_AT_ONCE if across_nodes else chosen, SLEEP_AT_ONCE)


def reached(seen: int, target: int) -> bool:
    """Whether step word ``seen`` is at or past ``target`` (both uint32; wrap-safe)."""
    return ((seen - target) & STEP_MASK) <= STEP_MASK >> 1


def process_alive(pid: int) -> bool:
    """False once ``pid`` has exited, also while it is a zombie its parent has not reaped yet.

    kill(pid, 0) succeeds on a zombie: a launcher that waits for its ranks in
    order leaves a dead rank looking alive until the ranks before it exit.
    """
    if not _sync.process_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    except (OSError, IndexError):
        return True  # no /proc: trust kill()
    return state not in (b"Z", b"X")


def names(ranks: list[int], local_ranks) -> str:
    """'1, 3': the group ranks of some local ranks, for messages."""
    return ", ".join(str(ranks[r]) for r in local_ranks)


class Watch:
    """The checks between slices of every wait on one arena's peers.

    ``pid(local_rank)`` gives a peer's process id, ``standing(local_rank)`` its
    standing in the group (``IN_GROUP``, ``GAVE_UP``, ``LEFT``), ``ranks`` the
    group rank of each local rank.
    """

    def __init__(self, me: int, ranks: list[int], timeout_s: float, pid, standing):
        self.me = me
        self.ranks = ranks
        self.timeout_s = timeout_s
        self._pid = pid
        self._standing = standing
        self.aborted: str | None = None  # why the group was aborted; set from any thread

    def abort(self, why: str) -> None:
        """Make every wait of this arena raise at its next slice (within ``SLICE_NS``)."""
        self.aborted = why

    def raise_if_aborted(self, what: str) -> None:
        if self.aborted is not None:
            raise AbortedError(f"{what} on rank {self.ranks[self.me]} was aborted: {self.aborted}")

    def check(self, behind, waited_s: float, what: str, warn_after: float) -> float:
        """Raise if waiting for local ranks ``behind`` for ``waited_s`` seconds in ``what`` must stop;
        else log when the wait is long. Returns when to warn next (pass it back in)."""
        self.raise_if_aborted(what)
        me = self.ranks[self.me]
        dead = [r for r in behind if not process_alive(self._pid(r))]
        if dead:
            raise PeerDiedError(f"rank(s) {names(self.ranks, dead)} died (process exited) before reaching "
                                f"{what}; rank {me} was waiting for them")
        # Only the awaited ranks' standing: one that gave up while this rank waits for another (both waiting for
        # a missing rank, the first to time out gives up) is named when this rank waits for it, if ever.
        standing = {r: self._standing(r) for r in behind}
        gave_up = [r for r in behind if standing[r] == GAVE_UP]
        if gave_up:
            raise PeerGaveUpError(f"rank(s) {names(self.ranks, gave_up)} gave up mid-collective after an error "
                                  f"(see its message) and take no further step, so {what} cannot complete; "
                                  f"rank {me} was waiting for them")
        left = [r for r in behind if standing[r] == LEFT]
        if left:
            raise PeerLeftError(f"rank(s) {names(self.ranks, left)} closed the group (destroy_process_group or "
                                f"abort()) without reaching {what}; rank {me} was waiting for them")
        if waited_s >= self.timeout_s:
            arrived = [r for r in range(len(self.ranks)) if r not in behind]
            there = f"; rank(s) {names(self.ranks, arrived)} reached it" if arrived else ""
            # "Timed out", as Gloo and NCCL word it (torch's tests and tools look for it).
            raise PeerTimeoutError(f"rank {self.ranks[self.me]}: Timed out after {self.timeout_s:g} s in {what}: "
                                   f"rank(s) {names(self.ranks, behind)} did not reach it{there}")
        if waited_s >= warn_after:
            log.warning("rank %d has waited %.0f s in %s for rank(s) %s (alive, not there yet); timeout in "
                        "%.0f s", self.ranks[self.me], waited_s, what, names(self.ranks, behind),
                        self.timeout_s - waited_s)
            return warn_after * 2
        return warn_after

    def first_warning(self) -> float:
        return first_wait_warning(self.timeout_s)


def until_reached(watch: Watch, lines: int, local_ranks, step: int, what) -> None:
    """Block until every rank of ``local_ranks`` (local indices) has reached ``step``, checking ``watch``
    between slices: the slow part of a wait whose first slice (with its spin and yield budgets) has
    ended. ``what()`` names the collective, for messages."""
    start = time.monotonic()
    warn_after = watch.first_warning()
    target = step & STEP_MASK
    while True:
        behind = [r for r in local_ranks if r != watch.me and not reached(_sync.load_step(lines, r), target)]
        if not behind:
            return
        warn_after = watch.check(behind, time.monotonic() - start, what(), warn_after)
        _sync.wait_ranks(lines, min(behind), max(behind) + 1, watch.me, target, 0, 0, SLICE_NS)
