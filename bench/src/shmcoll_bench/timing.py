"""How the sweeps time a collective: calibration, rounds, and the memcpy ceiling.

Every function here takes ``ctrl``, the control plane of the job: ``barrier()``,
``max(values)`` (element-wise over ranks) and ``gather_all(values)`` (one row per rank), run
on a group or communicator that is never timed (shmcoll_bench.sweep.Ctrl over a gloo group,
shmcoll_bench.mpi.MpiCtrl over a duplicate of MPI_COMM_WORLD).  All ranks therefore agree on
iteration counts and start each timed loop together, and a timed loop contains nothing but
the call under test.

A round is a short warm-up, a control barrier, then ``iters`` calls timed with perf_counter;
the sweeps reduce the rounds to latency = median over rounds of the slowest rank's time per
call (shmcoll_bench.report.measured).
"""
from __future__ import annotations

import os
import time

import torch

MAX_ITERS = 1_000_000


def pin(local_rank: int, local_ranks: int) -> list[int]:
    """Bind this process (and the threads it starts later) to its share of its affinity mask, and return
    those CPUs (``--pin``): local rank r of n the r-th of n consecutive equal shares, as numactl or taskset
    would give one rank per socket; where ranks outnumber the CPUs, the one CPU r modulo their number.

    With more ranks than CPUs the kernel decides which ranks share a core, and changes its mind
    from run to run and within a run: 4 ranks on 2 cores take 32-45 us for a 256 KiB all_gather
    two to a core and 55-67 us with three on one, shm and Open MPI alike
    (``bench/bench_oversubscribed.py``). Pinned the same way, both sweeps share cores alike. With fewer
    ranks than CPUs (a rank of many threads), whether binding pays is what bench/threads.sh's ``pinned``
    part measures; shm's lanes follow the binding (a rank bound to its own CPUs shares them with no local
    rank, so its lanes default to its share)."""
    cpus = sorted(os.sched_getaffinity(0))
    if local_ranks >= len(cpus):
        mine = [cpus[local_rank % len(cpus)]]
    else:
        mine = cpus[local_rank * len(cpus) // local_ranks:(local_rank + 1) * len(cpus) // local_ranks]
    os.sched_setaffinity(0, mine)
    return mine


def run_calls(fn, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return time.perf_counter() - t0


def calibrate(fn, ctrl, iters_time: float, warmup: int) -> int:
    """Collectively agreed iteration count so that one round lasts ~iters_time seconds.

    Batches of 1, 10, 100, ... calls until one lasts a few ms; the slowest rank's time sets
    the count, so that every rank runs the same number of calls (a collective whose ranks
    disagree on it would hang)."""
    for _ in range(warmup):
        fn()
    target = max(1e-3, min(0.02, iters_time / 4))
    n = 1
    while True:
        ctrl.barrier()
        t = ctrl.max([run_calls(fn, n)])[0]  # identical on every rank
        if t >= target or n >= MAX_ITERS // 10:
            break
        n *= 10
    per_call = max(t / n, 1e-9)
    iters = int(min(MAX_ITERS, max(1, round(iters_time / per_call))))
    return int(ctrl.max([iters])[0])  # belt and braces: every rank uses the same count


def timed_round(fn, ctrl, iters: int) -> float:
    """This rank's time per call over one round of ``iters`` calls."""
    for _ in range(max(1, min(50, iters // 10))):  # warm-up (caches, after the other backend)
        fn()
    ctrl.barrier()
    return run_calls(fn, iters) / iters


def best_round(fn, ctrl, iters_time: float, rounds: int, warmup: int) -> float:
    """This rank's best time per call over ``rounds`` rounds of an agreed number of calls (``calibrate``: every
    rank must make as many calls), for the scripts that report a call's best case rather than the sweeps' median."""
    iters = calibrate(fn, ctrl, iters_time, warmup)
    return min(timed_round(fn, ctrl, iters) for _ in range(rounds))


def measure_memcpy(ctrl, nbytes: int, seconds: float) -> list:
    """Copy bandwidth (GB/s, bytes copied per second, torch's threads) of every rank, measured
    while all ranks copy at the same time."""
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in
    dst.copy_(src)
    ctrl.barrier()
    n = 0
    t0 = time.perf_counter()
    while True:
        dst.copy_(src)
        n += 1
        el = time.perf_counter() - t0
        if el >= seconds and n >= 2:
            break
    gbps = n * nbytes / el / 1e9
    return [row[0] for row in ctrl.gather_all([gbps])]
