"""A group's life around its calls: a tensor of another device refused, Work that returns before it
completes and waits with a timeout, a new group's own timeout, destroying groups and initialising again."""
from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from tests import leaks
from tests.references import assert_equal, assert_refused


def _foreign_device_is_refused(rank, world):
    assert_refused(lambda: dist.all_reduce(torch.zeros(4, device="meta")), (ValueError, RuntimeError),
                   ("CPU", "meta"), "an all_reduce of a meta tensor")


def _async_returns_before_completion(rank, world):
    if world == 1:
        return
    big = torch.ones(16 << 20)  # 64 MiB
    dist.all_reduce(big)  # warm
    start = time.perf_counter()
    dist.all_reduce(big)
    sync_time = time.perf_counter() - start
    start = time.perf_counter()
    work = dist.all_reduce(big, async_op=True)
    issue_time = time.perf_counter() - start
    a = torch.randn(256, 256)
    for _ in range(3):
        a = a @ a / 256  # computation while the all-reduce progresses
    work.wait()
    # Returning takes a queue hand-off; the work itself takes the whole synchronous time.
    # Half leaves room for a loaded machine (measured 1/4 to 1/10 when quiet).
    assert issue_time < sync_time / 2, (issue_time, sync_time)
    assert big[0].item() == world ** 3, big[0].item()


def _wait_timeout(rank, world):
    if world == 1:
        return
    if rank == 0:
        t = torch.zeros(1)
        work = dist.irecv(t, 1)
        start = time.monotonic()
        try:
            work.wait(timedelta(milliseconds=300))
        except RuntimeError as error:
            assert "did not complete within 0.3 s" in str(error), error
            assert 0.25 < time.monotonic() - start < 3, time.monotonic() - start
        else:
            raise AssertionError("wait(timeout) returned before the message was sent")
        dist.barrier()
        work.wait()
        assert t.item() == 42
    else:
        dist.barrier()
        if rank == 1:
            dist.send(torch.tensor([42.0]), 0)


def _new_group_timeout_is_honoured(rank, world):
    if world == 1:
        return
    group = dist.new_group(timeout=timedelta(seconds=1))  # the default group's is 30 minutes
    if rank == 0:
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=group)
        except RuntimeError as error:
            elapsed = time.monotonic() - start
            assert 0.9 < elapsed < 2.5, elapsed
            assert "Timed out after 1 s" in str(error) and "rank(s) 1" in str(error), error
        else:
            raise AssertionError("all_reduce returned although rank 1 never called it")
    dist.barrier()  # rank 1 arrives here without calling the all_reduce
    dist.destroy_process_group(group)


def _destroy_and_reinit(rank, world):
    sub = dist.new_group()
    x = torch.ones(2)
    dist.all_reduce(x, group=sub)
    dist.destroy_process_group(sub)
    maps = [line for line in leaks.references() if line.startswith("map ")]
    assert len(maps) == (1 if world > 1 else 0), maps  # only the default group's arena is mapped
    dist.destroy_process_group()
    assert not leaks.references()
    # A fresh FileStore per round: re-binding env://'s TCPStore port races with the old server.
    folder = os.path.dirname(os.environ["SHMCOLL_TEST_REPORT"])
    for round_ in range(2):
        dist.init_process_group("shm", init_method=f"file://{folder}/reinit-{round_}", rank=rank,
                                world_size=world)
        y = torch.full((3,), float(rank))
        dist.all_reduce(y)
        assert_equal(y, torch.full((3,), float(sum(range(world)))), "after re-init")
        dist.destroy_process_group()
    dist.init_process_group("shm", init_method=f"file://{folder}/reinit-final", rank=rank, world_size=world)


# case name -> check(rank, world), in the order lifecycle runs them (its count of cases)
LIFECYCLE_CASES = {
    "device/meta_refused": _foreign_device_is_refused,
    "async/returns_before_completion": _async_returns_before_completion,
    "work/wait_timeout": _wait_timeout,
    "timeout/new_group": _new_group_timeout_is_honoured,
    "lifecycle/destroy_and_reinit": _destroy_and_reinit,
}


def lifecycle(cases):
    cases.run_each(LIFECYCLE_CASES, dist.get_rank(), dist.get_world_size())
