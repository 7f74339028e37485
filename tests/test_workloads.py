"""Issue "DDP, FSDP, ZeRO and checkpointing unchanged": shm vs gloo parity.

One job per (backend, world size) runs every workload of tests/workloads.py
(start-up costs seconds, the workloads milliseconds); the jobs are cached for
the module and each test looks at one workload:

- ``test_workload``: the workload ran on that backend without error on every
  rank, matched its single-process reference (where it has one), and left the
  replicas bitwise identical (DDP, ZeRO and FSDP2 all promise that every rank
  ends with the same parameters; a backend whose all-reduce gives ranks
  different bits breaks it).
- ``test_parity``: losses of every step on every rank and the final
  parameters under shm equal those under gloo within the tolerances below.

Tolerances (torch.testing.assert_close, compared in float64):

- float32 training (DDP, no_sync, find_unused, ZeRO/Adam, FSDP2):
  rtol=1e-5, atol=1e-6. With 2 ranks a sum of two gradients is the same in
  any order, so shm and gloo agree bitwise (measured: 0 difference). With 3
  ranks (a+b)+c and a+(b+c) can differ by an ulp, and gloo's ring reduces
  each chunk in another order than shm; 5-6 small steps of SGD(momentum) or
  Adam on a tiny tanh MLP keep that tiny (measured: at most 6e-8 absolute on
  values of size <= 1, i.e. ~6% of the tolerance). 1e-6 absolute covers
  parameters and losses that pass close to zero.
- fp16 compression hook: rtol=2e-3, atol=5e-4. The hook divides each
  gradient bucket by the world size in float16 and all-reduces float16; with
  3 ranks gloo rounds to float16 after each addition while shm sums in
  float32 and rounds once, so a reduced gradient may differ by a float16 ulp
  (2^-11..2^-10 relative). SGD (lr 0.1, momentum 0.9) adds the gradients
  of the 5 steps into the parameters with a total weight of
  0.1 x (4.1 + 3.4 + 2.7 + 1.9 + 1) ~ 1.3, so parameters may differ by about
  an ulp of the larger gradients, ~1e-4 absolute (measured: 1.0e-4 max,
  20% of the tolerance; 0 with 2 ranks). Losses differ less (4e-5 relative).
- bf16 compression hook: rtol=1.6e-2, atol=4e-3: the same argument with
  bfloat16's 8x larger ulp (2^-8 relative) (measured: 5.3e-4 max).
- object collectives and checkpoints: exact (``==`` on the Python objects,
  bitwise on the loaded tensors): nothing is computed, only moved.
"""
from __future__ import annotations

import pytest
import torch

from tests.harness import shm_entries, spawn

# The compatibility tier (TESTING.md, "Every torch") takes every workload at 2 ranks, on both backends.
WORLD_SIZES = [pytest.param(2, marks=pytest.mark.compat), 3]
BACKENDS = ["gloo", "shm"]

# Must match tests/workloads.py WORKLOADS (checked by test_workload_list).
WORKLOADS = ["ddp_default", "ddp_no_sync", "ddp_find_unused", "ddp_fp16_hook", "ddp_bf16_hook",
             "zero_optimizer", "object_collectives", "checkpoint", "checkpoint_sharded", "fsdp2"]

FP32_TOL = dict(rtol=1e-5, atol=1e-6)
PARITY_TOL = {
    "ddp_default": FP32_TOL,
    "ddp_no_sync": FP32_TOL,
    "ddp_find_unused": FP32_TOL,
    "ddp_fp16_hook": dict(rtol=2e-3, atol=5e-4),
    "ddp_bf16_hook": dict(rtol=1.6e-2, atol=4e-3),
    "zero_optimizer": FP32_TOL,
    "fsdp2": FP32_TOL,
    "checkpoint": dict(rtol=0, atol=0),
    "checkpoint_sharded": dict(rtol=0, atol=0),
}
# Workloads whose final parameters must be bitwise identical on every rank.
REPLICATED = {"ddp_default", "ddp_no_sync", "ddp_find_unused", "ddp_fp16_hook", "ddp_bf16_hook",
              "zero_optimizer", "fsdp2", "checkpoint"}

JOB_TIMEOUT = 240  # s per job; each workload's group times out after 60 s (fsdp2: the default group)


class Job:
    def __init__(self, backend: str, world: int):
        before = shm_entries()
        self.result = spawn("tests.workloads:all_workloads", world, backend=backend, timeout=JOB_TIMEOUT,
                            args=["all"])
        self.leftovers = shm_entries() - before
        self.backend, self.world = backend, world

    def failures(self, workload: str) -> list[str]:
        """Failed cases of ``workload`` (its own case and its sub-cases) on every rank."""
        failed = []
        for rank, report in enumerate(self.result.reports):
            if report is None:
                failed.append(f"rank {rank} reported nothing (exit {self.result.returncodes[rank]}):\n"
                              f"{self.result.outputs[rank][-3000:]}")
                continue
            cases = {c: e for c, e in report["cases"].items() if c == workload or c.startswith(workload + "/")}
            if not cases:
                failed.append(f"rank {rank}: no case of {workload} ran")
            failed += [f"rank {rank} {case}: {error}" for case, error in cases.items() if error is not None]
        return failed

    def data(self, workload: str) -> list[dict | None]:
        return [None if report is None else report["workloads"].get(workload) for report in self.result.reports]


@pytest.fixture(scope="module")
def jobs():
    cache: dict[tuple[str, int], Job] = {}

    def get(backend: str, world: int) -> Job:
        if (backend, world) not in cache:
            cache[(backend, world)] = Job(backend, world)
        return cache[(backend, world)]

    return get


@pytest.mark.compat
def test_workload_list():
    from tests.workloads import WORKLOADS as defined

    assert sorted(defined) == sorted(WORKLOADS)


@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_job_exits_cleanly(jobs, backend, world):
    job = jobs(backend, world)
    assert all(report is not None for report in job.result.reports), job.result.outputs
    assert job.result.returncodes == [0] * world, [o[-2000:] for o in job.result.outputs]
    assert all(report["backend"] == backend for report in job.result.reports)
    assert job.leftovers == set(), f"left in /dev/shm: {job.leftovers}"


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_workload(jobs, backend, world, workload):
    job = jobs(backend, world)
    failures = job.failures(workload)
    assert not failures, f"{workload} on {backend} x{world}:\n" + "\n".join(failures)
    if workload in REPLICATED:
        data = job.data(workload)
        ref = torch.tensor(data[0]["params"])
        for rank in range(1, world):
            mine = torch.tensor(data[rank]["params"])
            assert torch.equal(mine, ref), (f"{workload} on {backend} x{world}: rank {rank}'s parameters differ "
                                            f"from rank 0's (max |diff| {(mine - ref).abs().max().item():.3g})")


def _compare(actual, expected, what, tol):
    torch.testing.assert_close(torch.tensor(actual, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64),
                               msg=lambda m: f"{what}: {m}", **tol)


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_parity(jobs, world, workload):
    gloo, shm = jobs("gloo", world), jobs("shm", world)
    gloo_failures = gloo.failures(workload)
    assert not gloo_failures, "the gloo baseline failed:\n" + "\n".join(gloo_failures)
    shm_data, gloo_data = shm.data(workload), gloo.data(workload)
    missing = [rank for rank, d in enumerate(shm_data) if d is None]
    if missing:
        pytest.fail(f"{workload} did not complete under shm on ranks {missing}:\n"
                    + "\n".join(shm.failures(workload)))
    for rank in range(world):
        mine, theirs = shm_data[rank], gloo_data[rank]
        if workload == "object_collectives":
            for op in ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"):
                assert op in mine, f"rank {rank}: {op} did not complete under shm:\n" + "\n".join(
                    shm.failures(f"{workload}/{op}"))
                assert mine[op] == theirs[op], f"rank {rank} {op}: shm {mine[op]!r} != gloo {theirs[op]!r}"
            continue
        tol = PARITY_TOL[workload]
        if "losses" in theirs:
            _compare(mine["losses"], theirs["losses"], f"rank {rank} losses, shm vs gloo", tol)
        _compare(mine["params"], theirs["params"], f"rank {rank} final parameters, shm vs gloo", tol)
        for key in sorted(set(theirs) - {"losses", "params"}):
            assert key in mine, f"rank {rank}: no {key} under shm:\n" + "\n".join(shm.failures(workload))
            if isinstance(theirs[key], float):
                _compare(mine[key], theirs[key], f"rank {rank} {key}, shm vs gloo", tol)
            else:
                assert mine[key] == theirs[key], f"rank {rank} {key}: shm {mine[key]!r} != gloo {theirs[key]!r}"
    # shm must also have passed its own in-rank checks (reference, consolidation, load == save).
    failures = shm.failures(workload)
    assert not failures, "\n".join(failures)
