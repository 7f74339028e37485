"""The one launcher of every multi-rank test, and the scenario jobs built on it.

``Ranks`` starts the N processes of a job (a module run with ``python -m``, or
a forkserver child for the failure-injection tests), each with its rank in the
environment, and watches, kills and collects them. ``torchrun_command`` is the
same for jobs that go through torchrun on purpose.

Starting a rank costs seconds (importing torch), so one job runs a whole
scenario: many cases, each checked inside the ranks against a reference, and
reported back as {case: None or failure text} (``spawn``). The parent checks
that every rank finished, ran the cases the scenario defines, passed them, and
kept no segment mapped or open after its groups were destroyed (``tests.leaks``).
"""
from __future__ import annotations

import json
import os
import signal
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

    def case_names(self) -> list[list[str] | None]:
        """The cases each rank ran (None: it reported nothing)."""
        return [sorted(r["cases"]) if r is not None else None for r in self.reports]

    def case_count(self) -> int:
        """The cases every rank ran; raises unless every rank reported the same cases."""
        names = self.case_names()
        for rank, theirs in enumerate(names):
            if theirs != names[0]:
                differ = sorted(set(theirs or ()) ^ set(names[0] or ()))
                raise AssertionError(f"rank {rank} ran other cases than rank 0: {len(theirs or ())} against "
                                     f"{len(names[0] or ())}, differing in {differ[:10]}")
        return len(names[0]) if names else 0

    def leaks(self) -> list[str]:
        """Segments a rank still mapped or held open after destroying its groups (tests/worker.py)."""
        return [f"rank {rank}: {line}" for rank, report in enumerate(self.reports)
                if report is not None for line in report.get("leaks", ())]


def rank_environment(extra: dict | None = None) -> dict:
    """The environment of a rank process: ours, the repository importable, one torch thread, ``extra``."""
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(extra or {})}


def torchrun_command(nproc: int, module: str, *args: str, options=()) -> list[str]:
    """torchrun (of this interpreter) starting ``nproc`` ranks of ``python -m module args``, on a free port."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
            f"--master-port={free_port()}", *options, "-m", module, *args]


class Ranks:
    """The ``world`` processes of one job, rank r with RANK=LOCAL_RANK=r and WORLD_SIZE in its environment.

    ``module`` and ``args``: each rank runs ``python -m module *args`` (with ``rank_prefix(r)`` in front,
    e.g. ``unshare ...``), its output in ``log_dir/rankR.log``. Or ``fork``: a callable ``fork(r)`` that
    starts rank r some other way (a forkserver child that writes its own log there) and returns its
    ``multiprocessing.Process``. ``env`` applies to every rank, ``rank_env(r)`` to one; env:// rendezvous
    variables (MASTER_ADDR, a free MASTER_PORT) are set unless ``rendezvous`` is False.
    """

    def __init__(self, world: int, log_dir: str, module: str | None = None, args=(), env: dict | None = None,
                 rank_env=None, rank_prefix=None, fork=None, rendezvous: bool = True):
        self.world = world
        self.log_dir = log_dir
        common = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)}
        if rendezvous:
            common.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
        self.procs = []
        for rank in range(world):
            if fork is not None:
                self.procs.append(fork(rank))
                continue
            penv = rank_environment({**common, "RANK": str(rank), "LOCAL_RANK": str(rank), **(env or {}),
                                     **(rank_env(rank) if rank_env is not None else {})})
            prefix = rank_prefix(rank) if rank_prefix is not None else []
            with open(self.log_path(rank), "w") as log:
                self.procs.append(subprocess.Popen([*prefix, sys.executable, "-m", module, *args], env=penv,
                                                   cwd=REPO, stdout=log, stderr=subprocess.STDOUT))

    def log_path(self, rank: int) -> str:
        return os.path.join(self.log_dir, f"rank{rank}.log")

    def pid(self, rank: int) -> int:
        return self.procs[rank].pid

    def exitcode(self, rank: int):
        """Exit code (negative: the signal), or None while it runs; a rank we started is reaped here."""
        proc = self.procs[rank]
        return proc.poll() if isinstance(proc, subprocess.Popen) else proc.exitcode

    def running(self, ranks=None) -> list[int]:
        return [r for r in (range(self.world) if ranks is None else ranks) if self.exitcode(r) is None]

    def wait(self, timeout: float, ranks=None) -> list[int]:
        """Wait up to ``timeout`` s for ``ranks`` (default all); returns those still running."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.running(ranks)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.005)

    def kill(self, rank: int, sig=signal.SIGKILL) -> None:
        try:
            os.kill(self.pid(rank), sig)
        except ProcessLookupError:
            pass

    def finish(self, timeout: float) -> list[int]:
        """Wait for every rank up to ``timeout`` s, then SIGKILL the rest (after SIGUSR1, which asks ranks
        that registered faulthandler for their stacks); returns the ranks that had to be killed."""
        hung = self.wait(timeout)
        for rank in hung:
            self.kill(rank, signal.SIGUSR1)
        if hung:
            time.sleep(0.3)
        for rank in hung:
            self.kill(rank)
        self.wait(10)
        return hung

    def codes(self) -> list:
        return [self.exitcode(r) for r in range(self.world)]

    def log(self, rank: int, tail: int | None = None) -> str:
        try:
            text = open(self.log_path(rank), errors="replace").read()
        except FileNotFoundError:
            return ""
        return text if tail is None else text[-tail:]

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(f"--- rank {r} (exit {self.exitcode(r)}):\n{self.log(r, tail)}" for r in range(self.world))


def spawn(scenario: str, world_size: int, backend: str = "shm", env: dict | None = None,
          timeout: float = 300, args: list[str] | None = None, rank_env=None, rank_prefix=None) -> JobResult:
    """Run ``tests.worker scenario`` on ``world_size`` local ranks and collect their reports.

    ``rank_env(rank)``, when given, returns extra variables for that rank (e.g. its SHMCOLL_HOSTID);
    ``rank_prefix(rank)`` a command that runs that rank's interpreter (e.g. ``unshare ...``).
    """
    with tempfile.TemporaryDirectory(prefix="shmcoll-test-") as tmp:
        job = Ranks(world_size, tmp, "tests.worker", [scenario, *(args or [])], rank_env=rank_env,
                    rank_prefix=rank_prefix, env={"SHMCOLL_TEST_BACKEND": backend,
                                                  "SHMCOLL_TEST_REPORT": os.path.join(tmp, "rank{rank}.json"),
                                                  **(env or {})})
        hung = job.finish(timeout)
        outputs = [job.log(r) for r in range(world_size)]
        if hung:
            raise AssertionError(f"{scenario} at world size {world_size} did not finish in {timeout} s:\n"
                                 + "\n".join(f"--- rank {r}:\n{o[-2000:]}" for r, o in enumerate(outputs)))
        reports = []
        for rank in range(world_size):
            path = os.path.join(tmp, f"rank{rank}.json")
            reports.append(json.load(open(path)) if os.path.exists(path) else None)
        return JobResult(job.codes(), reports, outputs)


def assert_job_passes(result: JobResult, min_cases) -> None:
    """Every rank exited 0, ran its cases, all passed, and left no segment mapped or open.

    ``min_cases``: what the scenario defines for this job. A number: every rank ran the same cases, at
    least that many. A list, for scenarios whose ranks have roles (members of some subgroups, senders and
    receivers): at least ``min_cases[r]`` on rank r.
    """
    failures = result.failures()
    assert not failures, f"{len(failures)} failed case(s):\n" + "\n".join(failures[:40])
    assert all(code == 0 for code in result.returncodes), (result.returncodes, result.outputs)
    if isinstance(min_cases, int):
        assert result.case_count() >= min_cases, f"only {result.case_count()} cases ran, not {min_cases}"
    else:
        counts = [len(names or ()) for names in result.case_names()]
        assert all(n >= least for n, least in zip(counts, min_cases, strict=True)), \
            f"cases per rank: {counts}, the scenario defines {list(min_cases)}"
    assert not result.leaks(), "segments still mapped or open after destroy_process_group:\n" + \
        "\n".join(result.leaks())


def torchrun_nodes(scenario: str, args: list[str], nnodes: int, nproc, master_addr: str = "127.0.0.1",
                   node_env=None, node_prefix=None, timeout: float = 90) -> JobResult:
    """Run ``tests.worker scenario`` through ``nnodes`` torchrun invocations (--nnodes, static rendezvous).

    ``nproc``: ranks per node, or a list with each node's count (nodes of different sizes).

    ``node_env(node)`` gives that invocation's extra variables (its SHMCOLL_HOSTID, ...),
    ``node_prefix(node)`` a command to run it under (e.g. ``ip netns exec NS``). Each rank's
    output in the result is its node's whole log.
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="shmcoll-test-") as tmp:
        counts = list(nproc) if isinstance(nproc, (list, tuple)) else [nproc] * nnodes
        node_of_rank = [node for node, count in enumerate(counts) for _ in range(count)]
        procs = []
        for node in range(nnodes):
            env = rank_environment({"SHMCOLL_TEST_BACKEND": "shm",
                                    "SHMCOLL_TEST_REPORT": os.path.join(tmp, "rank{rank}.json"),
                                    **(node_env(node) if node_env is not None else {})})
            prefix = node_prefix(node) if node_prefix is not None else []
            cmd = [*prefix, sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node",
                   str(counts[node]), "--node-rank", str(node), "--master-addr", master_addr, "--master-port", str(port),
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
