"""A torch.distributed backend that moves nothing, registered as shm is (a Python ProcessGroup subclass):
what torch itself costs around a call, the floor any such backend pays (bench_floor.py, bench_async.py)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from shmcoll._torch_compat import fail_loud_backend


class NoopWork(dist.Work):
    def wait(self, timeout=None) -> bool:
        return True


class NoopGroup(dist.ProcessGroup):
    def __init__(self, store, rank: int, size: int, timeout):
        super().__init__(rank, size)
        self._work = NoopWork()
        # a backend beneath, as shm registers one: torch keeps the group's name there (funcol looks it up)
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM,
                               fail_loud_backend(rank, size))

    def _done(self, *args, **kwargs):
        return self._work

    allreduce = allgather = all_gather_single = _allgather_base = allgather_into_tensor_coalesced = \
        reduce_scatter_single = _reduce_scatter_base = reduce_scatter_tensor_coalesced = alltoall_base = alltoall = \
        gather = scatter = _done

    def getBackendName(self) -> str:
        return "noop"


def register() -> None:
    """Make "noop" a backend name (``dist.new_group(backend="noop")``)."""
    dist.Backend.register_backend("noop", NoopGroup, devices=["cpu"])
