"""Collectives over several lanes (threads per rank): single copy's reads split over the lane threads, and
idle lane threads asleep."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from tests.scenarios import (allreduce_matrix, allreduce_matrix_planned, data_movement, data_movement_planned,
                             in_place_overlap, in_place_overlap_planned, rooted_and_scattered,
                             rooted_and_scattered_planned)


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


def single_copy_over_lanes_planned(world: int, big: str = "20011") -> int:
    return (allreduce_matrix_planned(world, big) + data_movement_planned(world, big)
            + rooted_and_scattered_planned(world) + in_place_overlap_planned(world) + 1)


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
    cases.check("lanes/result", bool((x == dist.get_world_size()).all()), "wrong all_reduce result")
    lanes = lane_threads()
    cases.check("lanes/started", len(lanes) >= 1, "no shmcoll-lane thread in /proc/self/task")

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
    cases.check("lanes/idle", used <= 2, f"idle lane threads used {used} clock ticks in 1 s")
    dist.barrier()
    dist.destroy_process_group()
    cases.check("lanes/gone", not lane_threads(), f"lane threads left after destroy_process_group: {lane_threads()}")
