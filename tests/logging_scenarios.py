"""Scenarios for tests/test_logging.py: what the "shmcoll" logger says during real jobs."""
from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist


def collectives(cases):
    """A few collectives, so that INFO shows the summary and DEBUG one line per collective."""
    tensor = torch.ones(3)
    dist.all_reduce(tensor)
    dist.broadcast(torch.ones(5), src=0)
    cases.check("all_reduce", torch.equal(tensor, torch.full((3,), float(dist.get_world_size()))))
    dist.all_reduce(torch.ones(2))  # a call met before: a fast path's, which logs it all the same


def late_peer(cases):
    """The last rank arrives 2.5 s late (group timeout 6 s): the others warn, then all succeed."""
    group = dist.new_group(backend="shm", timeout=timedelta(seconds=6))
    late = dist.get_rank() == dist.get_world_size() - 1
    if late:
        time.sleep(2.5)
    tensor = torch.ones(3)
    dist.all_reduce(tensor, group=group)
    cases.check("all_reduce", torch.equal(tensor, torch.full((3,), float(dist.get_world_size()))))
    if late:
        time.sleep(2.5)
    payload = torch.arange(4.0)
    if dist.get_rank() == 0:
        received = torch.zeros(4)
        dist.recv(received, src=dist.get_world_size() - 1, group=group)
        cases.check("recv", torch.equal(received, payload))
    elif late:
        dist.send(payload, dst=0, group=group)
    dist.destroy_process_group(group)
