"""What torch's flight recorder (torch 2.15 and later) does with a job's groups: shm's none, Gloo's as ever.

``recorded`` runs one collective on the default group (shm), on a subgroup of shm and on a Gloo group beside
them, then checks that torch attached its recorder hook to no shm group (it would record nothing there: shm's
collectives never reach the dispatcher kernels it records in) and that the recorder's dump holds the Gloo
collective as Gloo records it, and nothing of shm's.
"""
from __future__ import annotations

import pickle

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch.distributed import distributed_c10d


def recorded(cases, recording: str):
    """``recording``: "1" where the recorder is on (its default, or TORCH_FR_BUFFER_SIZE set), "0" where
    TORCH_FR_BUFFER_SIZE=0 turns it off."""
    world = dist.get_world_size()
    sub = dist.new_group(backend="shm")
    gloo = dist.new_group(backend="gloo")
    for name, group in (("world", None), ("subgroup", sub), ("gloo", gloo)):
        tensor = torch.ones(4)
        dist.all_reduce(tensor, group=group)
        cases.check(f"all_reduce on {name}", torch.equal(tensor, torch.full((4,), float(world))))
    hooks = distributed_c10d._world.pg_flight_recorder_hooks
    hooked = [dist.get_backend(group) for group in hooks]
    cases.check("no hook on shm's groups", "shm" not in hooked, f"hooks on {hooked}")
    names = [entry["profiling_name"] for entry in pickle.loads(c10d._dump_fr_trace()).get("entries", [])]
    expected = ["gloo:all_reduce"] if recording == "1" else []
    cases.check("the dump holds Gloo's collective, and only it", names == expected, f"{names} != {expected}")
    dist.destroy_process_group(sub)
    dist.destroy_process_group(gloo)
