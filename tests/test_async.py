"""Asynchronous calls never wait for peers, a Work per call, nothing held after use (tests.async_scenarios),
on shm and on Gloo groups in the same job, at 2, 3 and 4 ranks on one node."""
import pytest

from shmcoll.placement.node import OneNode
from tests.harness import assert_job_passes, spawn

P2P_BYTES = 64 << 10


# The compatibility tier (TESTING.md, "Every torch"): the semantics at 3 ranks, and every Work torch holds.
@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.compat), 4])
def test_async_semantics(world_size):
    result = spawn("tests.async_scenarios:async_semantics", world_size, env={"SHMCOLL_P2P_BYTES": str(P2P_BYTES)},
                   args=[str(OneNode.async_try_bytes), str(P2P_BYTES)])
    # crossed: 10 collectives x 4 sizes + the barrier, on 2 backends, and the list form of all_to_all x 4 sizes on
    # shm alone; async_then_recv: 6 sizes x 2; late_peers: 7 collectives x 3 sizes x 2 calls; works_per_call: 8;
    # released: 18 calls (send_recv at even sizes only) x 2 sizes x 2 ways x 2 calls
    released = (18 if world_size % 2 == 0 else 17) * 8
    # crossed on shm alone: 4 collectives with empty tensors, and under the profiler 4 x 2 sizes + the barrier
    assert_job_passes(result, min_cases=2 * (10 * 4 + 1) + 4 + 4 + 9 + 12 + 42 + 8 + released)


@pytest.mark.compat
@pytest.mark.parametrize("world_size", [2, 3])
def test_works_held_by_torch(world_size):
    result = spawn("tests.async_scenarios:works_held_by_torch", world_size)
    # functional and chained: 2 sizes x 2 backends; waiting_callbacks: 2 sizes x 3 ways x 2 backends, but the
    # nested way on shm alone; waiting_transfer_callbacks: 2 sizes x 2 ways; ddp_hook
    assert_job_passes(result, min_cases=2 * 2 * 2 + 2 * (3 * 2 - 1) + 2 * 2 + 1)
