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
from tests.rooted_scenarios import rooted_and_scattered, rooted_and_scattered_cases

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
