"""The lane threads a rank splits large collectives over (SHMCOLL_THREADS): single copy borrowing them for
every collective it runs, and the threads sleeping while nothing runs and ending with their group."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from tests.all_reduce_scenarios import allreduce_matrix, allreduce_matrix_cases
from tests.movement_scenarios import data_movement, data_movement_cases
from tests.overlap_scenarios import in_place_overlap, in_place_overlap_cases
from tests.references import assert_equal, make_input, reference_reduce
from tests.rooted_scenarios import rooted_and_scattered, rooted_and_scattered_cases

# The collectives the compiled front splits over the lanes, each at a size just above the split (two lanes, a
# ragged end) and at one that takes every lane; then a late peer's, and last (the group is unusable after it)
# two collectives met at once.
COMPILED_CALLS = ("all_reduce", "broadcast", "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor",
                  "reduce")
COMPILED_SIZES = ("two_lanes", "every_lane")
COMPILED_OTHER = _LATE, _MISMATCH = ("compiled_lanes/late_peer", "compiled_lanes/mismatch")
# What lane_threads_sleep checks, in order: the result, the threads there, idle, gone after destroy.
SLEEP_CHECKS = _RESULT, _STARTED, _IDLE, _GONE = ("lanes/result", "lanes/started", "lanes/idle", "lanes/gone")


def lane_threads() -> list[str]:
    """The ids of this process's lane threads (native threads, named shmcoll-lane<j>)."""
    found = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().startswith("shmcoll-lane"):
                    found.append(task)
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return found


def single_copy_over_lanes(cases, big: str = "20011"):
    """The all-reduce matrix, every data-movement collective, the rooted ones and all_to_all with single copy
    forced on and several lanes:
    their reads and reductions split over the lane threads, which single copy must have borrowed."""
    allreduce_matrix(cases, big)
    data_movement(cases, big)
    rooted_and_scattered(cases)
    in_place_overlap(cases)
    lanes = dist.group.WORLD.placement.lanes
    cases.check("lanes/single-copy", lanes._single_copy is not None and len(lane_threads()) == lanes.count - 1,
                f"single copy did not split over the lanes ({len(lane_threads())} lane threads)")


def compiled_over_lanes(cases):
    """A synchronous collective large enough to split runs whole in the compiled front, which starts the
    lanes' pool in C (``_front.SmallCollectives``): the second call of each (the first admits its plan) is
    taken there and gives the reference's result bit for bit; a peer that comes late is waited for the slow way
    (``Lanes.finish``); ranks in two different collectives over the lanes each raise, naming both."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    lanes = pg.placement.lanes
    counts = {"two_lanes": lanes.split_bytes // 4 + 13, "every_lane": lanes.count * lanes.min_bytes // 4 + 29}

    def collective(name: str, count: int, case: str):
        """Run collective ``name`` of ``count`` float32 per rank; check its result."""
        if name == "all_reduce":
            inputs = [make_input(case, r, torch.float32, count) for r in range(world)]
            x = inputs[rank].clone()
            dist.all_reduce(x)
            assert_equal(x, reference_reduce(inputs, "sum", torch.float32), case)
        elif name == "broadcast":
            x = make_input(case, 0, torch.float32, count) if rank == 0 else torch.zeros(count)
            dist.broadcast(x, 0)
            assert_equal(x, make_input(case, 0, torch.float32, count), case)
        elif name == "all_gather_into_tensor":
            out = torch.zeros(world * count)
            dist.all_gather_into_tensor(out, make_input(case, rank, torch.float32, count))
            assert_equal(out, torch.cat([make_input(case, r, torch.float32, count) for r in range(world)]), case)
        elif name == "reduce":  # to the last rank; the others' tensors as they were
            inputs = [make_input(case, r, torch.float32, count) for r in range(world)]
            x = inputs[rank].clone()
            dist.reduce(x, world - 1)
            assert_equal(x, reference_reduce(inputs, "sum", torch.float32) if rank == world - 1 else inputs[rank],
                         case)
        elif name == "all_gather":  # the list form, each output its own tensor
            outs = [torch.zeros(count) for _ in range(world)]
            dist.all_gather(outs, make_input(case, rank, torch.float32, count))
            for r in range(world):
                assert_equal(outs[r], make_input(case, r, torch.float32, count), f"{case} block {r}")
        else:
            inputs = [make_input(case, r, torch.float32, world * count) for r in range(world)]
            out = torch.zeros(count)
            dist.reduce_scatter_tensor(out, inputs[rank].clone())
            assert_equal(out, reference_reduce(inputs, "sum", torch.float32)[rank * count:(rank + 1) * count], case)

    def taken_by_the_front(name: str, count: int, case: str):
        collective(name, count, f"{case}/admit")
        before = pg._small.taken
        collective(name, count, case)
        assert pg._small.taken == before + 1, f"{case}: the compiled front did not take the call"

    for name in COMPILED_CALLS:
        for size in COMPILED_SIZES:
            case = f"compiled_lanes/{name}/{size}"
            cases.run(case, taken_by_the_front, name, counts[size], case)

    def late_peer():
        if rank == world - 1:
            time.sleep(0.35)  # several wait slices: the lanes' first slice ends before it comes
        before = pg._small.taken
        collective("all_reduce", counts["every_lane"], _LATE)
        assert pg._small.taken == before + 1, "the compiled front did not take the late call"

    cases.run(_LATE, late_peer)

    def mismatch():
        try:
            collective("all_reduce" if rank == 0 else "broadcast", counts["every_lane"], _MISMATCH)
        except Exception as error:  # the group is unusable from here on: the scenario's last case
            assert "mismatched collectives" in str(error) and "all_reduce" in str(error) \
                and "broadcast" in str(error), f"not the mismatch: {error}"
        else:
            raise AssertionError("two different collectives over the lanes did not raise")

    cases.run(_MISMATCH, mismatch)


def compiled_over_lanes_cases() -> int:
    """How many cases ``compiled_over_lanes`` runs on each rank."""
    return len(COMPILED_CALLS) * len(COMPILED_SIZES) + len(COMPILED_OTHER)


def lane_threads_sleep(cases):
    """After a collective split over lanes, the lane threads take no CPU while nothing runs."""
    x = torch.ones(1 << 20)  # 4 MiB: several lanes at the default SHMCOLL_THREAD_BYTES
    dist.all_reduce(x)
    cases.check(_RESULT, bool((x == dist.get_world_size()).all()), "wrong all_reduce result")
    lanes = lane_threads()
    cases.check(_STARTED, len(lanes) >= 1, "no shmcoll-lane thread in /proc/self/task")

    def ticks() -> int:  # user + system time of the lane threads, in clock ticks
        total = 0
        for task in lanes:
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total

    before = ticks()
    time.sleep(1.0)
    used = ticks() - before
    cases.check(_IDLE, used <= 2, f"idle lane threads used {used} clock ticks in 1 s")
    dist.barrier()
    dist.destroy_process_group()
    cases.check(_GONE, not lane_threads(), f"lane threads left after destroy_process_group: {lane_threads()}")


def single_copy_over_lanes_cases(world: int, big: str = "20011") -> int:
    """How many cases ``single_copy_over_lanes`` runs on each rank: the four scenarios', and its own check."""
    return (allreduce_matrix_cases(world, big) + data_movement_cases(world, big) + rooted_and_scattered_cases(world)
            + in_place_overlap_cases() + 1)


def lane_threads_sleep_cases() -> int:
    """How many checks ``lane_threads_sleep`` records on each rank."""
    return len(SLEEP_CHECKS)
