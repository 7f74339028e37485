"""Spawn real multi-process jobs for tests and collect what each rank reports.

Starting a rank costs seconds (importing torch), so one job runs a whole
scenario: many cases, each checked inside the ranks against a reference, and
reported back as {case: None or failure text}. The parent checks that every
rank finished, agrees, and that nothing of ours is left in /dev/shm.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_entries(directory: str = "/dev/shm") -> set[str]:
    """Entries that shmcoll could have made (its name prefix)."""
    try:
        return {name for name in os.listdir(directory) if name.startswith("shmcoll-")}
    except FileNotFoundError:
        return set()


class JobResult:
    def __init__(self, returncodes, reports, outputs):
        self.returncodes = returncodes
        self.reports = reports  # one dict per rank: {"cases": {...}, ...}
        self.outputs = outputs  # combined stdout+stderr per rank

    def failures(self) -> list[str]:
        """Every failed case on every rank, as text."""
        failed = []
        for rank, report in enumerate(self.reports):
            if report is None:
                failed.append(f"rank {rank} reported nothing (exit {self.returncodes[rank]}):\n"
                              f"{self.outputs[rank][-3000:]}")
                continue
            for case, error in report["cases"].items():
                if error is not None:
                    failed.append(f"rank {rank} {case}: {error}")
        return failed

    def case_count(self) -> int:
        return min((len(r["cases"]) for r in self.reports if r is not None), default=0)


def spawn(scenario: str, world_size: int, backend: str = "shm", env: dict | None = None,
          timeout: float = 300, args: list[str] | None = None, rank_env=None, rank_prefix=None) -> JobResult:
    """Run ``tests.worker scenario`` on ``world_size`` local ranks and collect their reports.

    ``rank_env(rank)``, when given, returns extra variables for that rank (e.g. its SHMCOLL_HOSTID);
    ``rank_prefix(rank)`` a command that runs that rank's interpreter (e.g. ``unshare ...``).
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="shmcoll-test-") as tmp:
        procs = []
        for rank in range(world_size):
            penv = dict(os.environ)
            penv.update({
                "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "SHMCOLL_TEST_BACKEND": backend, "SHMCOLL_TEST_REPORT": os.path.join(tmp, f"rank{rank}.json"),
                "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO) + os.pathsep + penv.get("PYTHONPATH", ""),
            })
            penv.update(env or {})
            penv.update(rank_env(rank) if rank_env is not None else {})
            log = open(os.path.join(tmp, f"rank{rank}.log"), "w+")
            prefix = rank_prefix(rank) if rank_prefix is not None else []
            procs.append((subprocess.Popen([*prefix, sys.executable, "-m", "tests.worker", scenario, *(args or [])],
                                           env=penv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO), log))
        deadline = time.monotonic() + timeout
        codes = []
        for proc, _ in procs:
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reports, outputs = [], []
        for rank, (_, log) in enumerate(procs):
            log.seek(0)
            outputs.append(log.read())
            log.close()
            path = os.path.join(tmp, f"rank{rank}.json")
            reports.append(json.load(open(path)) if os.path.exists(path) else None)
        if None in codes:
            raise AssertionError(f"{scenario} at world size {world_size} did not finish in {timeout} s:\n"
                                 + "\n".join(f"--- rank {r}:\n{o[-2000:]}" for r, o in enumerate(outputs)))
        return JobResult(codes, reports, outputs)


def assert_job_passes(result: JobResult, min_cases: int = 1) -> None:
    failures = result.failures()
    assert not failures, f"{len(failures)} failed case(s):\n" + "\n".join(failures[:40])
    assert all(code == 0 for code in result.returncodes), (result.returncodes, result.outputs)
    assert result.case_count() >= min_cases, f"only {result.case_count()} cases ran"


def torchrun_nodes(scenario: str, args: list[str], nnodes: int, nproc, master_addr: str = "127.0.0.1",
                   node_env=None, node_prefix=None, timeout: float = 90) -> JobResult:
    """Run ``tests.worker scenario`` through ``nnodes`` torchrun invocations (--nnodes, static rendezvous).

    ``nproc``: ranks per node, or a list with each node's count (nodes of different sizes).

    ``node_env(node)`` gives that invocation's extra variables (its SHMCOLL_HOSTID, ...),
    ``node_prefix(node)`` a command to run it under (e.g. ``ip netns exec NS``). Each rank's
    output in the result is its node's whole log.
    """
    port = free_port()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    with tempfile.TemporaryDirectory(prefix="shmcoll-test-") as tmp:
        counts = list(nproc) if isinstance(nproc, (list, tuple)) else [nproc] * nnodes
        node_of_rank = [node for node, count in enumerate(counts) for _ in range(count)]
        procs = []
        for node in range(nnodes):
            env = dict(os.environ, SHMCOLL_TEST_BACKEND="shm", SHMCOLL_TEST_REPORT=os.path.join(tmp, "rank{rank}.json"),
                       OMP_NUM_THREADS="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            env.update(node_env(node) if node_env is not None else {})
            prefix = node_prefix(node) if node_prefix is not None else []
            cmd = [*prefix, torchrun, "--nnodes", str(nnodes), "--nproc-per-node", str(counts[node]), "--node-rank",
                   str(node), "--master-addr", master_addr, "--master-port", str(port),
                   "-m", "tests.worker", scenario, *args]
            log = open(os.path.join(tmp, f"node{node}.log"), "w+")
            procs.append((subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT), log))
        deadline = time.monotonic() + timeout
        codes, outputs = [], []
        for proc, log in procs:
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                proc.terminate()  # torchrun passes SIGTERM on to its workers; SIGKILL would orphan them
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                codes.append(f"stopped after {timeout} s")
            log.seek(0)
            outputs.append(log.read())
            log.close()
        reports = []
        for rank in range(len(node_of_rank)):
            path = os.path.join(tmp, f"rank{rank}.json")
            reports.append(json.load(open(path)) if os.path.exists(path) else None)
    return JobResult([codes[node] for node in node_of_rank], reports, [outputs[node] for node in node_of_rank])
