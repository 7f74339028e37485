"""What torch's profiler records of a job's collectives, on whichever backend the job runs (shm or Gloo).

``profiled_job`` runs explicit collectives (synchronous, asynchronous small and large, point-to-point) and a
DDP training step under ``torch.profiler.profile(record_shapes=True)`` and reports, for every event named
``<backend>:<collective>``, how many there were and the input shapes each had, so that a test compares the
two backends' traces and the calls made.
"""
from __future__ import annotations

import collections

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

# The calls the job makes, by the event each should record: (name, input shapes of each, in order).
EXPECTED = {
    "all_reduce": [[[4, 3]], [[5]], [[1 << 18]]],  # + DDP's buckets (counted apart)
    "all_gather": [[[6]]],  # all_gather_into_tensor
    "broadcast": [[[7, 2]]],
    "barrier": [[]],
    "reduce_scatter": [[[16]], [[2], [3]]],  # reduce_scatter_tensor of 2 ranks x 8; the list form, uneven blocks
    "send": [[[3]]],  # each rank sends to the other, and receives
    "recv": [[[3]]],
}


def profiled_job(cases):
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.get_backend()
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)), bucket_cap_mb=0.01)
    data = torch.randn(8, 64)
    model(data).sum().backward()  # DDP's first step builds its buckets
    model.zero_grad()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(torch.ones(4, 3))
        dist.all_reduce(torch.ones(5), async_op=True).wait()  # small: inline
        dist.all_reduce(torch.ones(1 << 18), async_op=True).wait()  # 1 MiB: on the progress thread
        dist.all_gather_into_tensor(torch.empty(6 * world), torch.ones(6))
        dist.broadcast(torch.ones(7, 2), src=0)
        dist.barrier()
        dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8 * world))
        dist.reduce_scatter(torch.empty(2 + rank), [torch.ones(2 + r) for r in range(world)])
        peer, got = (rank + 1) % world, torch.empty(3)
        ops = [dist.P2POp(dist.isend, torch.ones(3), peer), dist.P2POp(dist.irecv, got, peer)]
        for work in dist.batch_isend_irecv(ops if rank == 0 else ops[::-1]):
            work.wait()
        model(data).sum().backward()  # DDP's all-reduces, overlapping the backward pass
    events = collections.defaultdict(list)
    for event in prof.events():
        prefix, _, name = event.name.partition(":")
        if prefix == backend and name:
            events[name].append(event.input_shapes)
    cases.check("profiled", True)
    return {"events": dict(events), "backend": backend, "buckets": len(model.reducer._get_zeros_like_grad_buckets())}
