"""Reliability of the shm backend under faults, with real processes.

Scenarios run inside the ranks (tests/faults.py). Most jobs start their ranks
from a multiprocessing forkserver that preloaded torch and shmcoll, so a rank
costs milliseconds, not ~3 s of CPU; the forkserver reaps its children at once,
as torchrun's agent does. Jobs that need fresh interpreters (torchrun, and the
launcher that does not reap) use subprocess.

Every job gets its own SHMCOLL_SHM_DIR, a folder on the /dev/shm tmpfs, so
leftovers are counted per job, exactly, and cannot be confused with segments of
other jobs running on the machine at the same time.

Figures (timings, kill-trial phases, error messages of shm and Gloo) are written
to $SHMCOLL_RELIABILITY_OUT (default: /tmp/shmcoll-reliability) as JSON files.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from shmcoll import arena as shm_arena
from tests import faults
from tests.harness import REPO, Ranks, free_port, rank_environment, torchrun_command

OUT = Path(os.environ.get("SHMCOLL_RELIABILITY_OUT", "/tmp/shmcoll-reliability"))
SHM_ROOT = Path("/dev/shm") / f"reltest-{os.getpid()}"
JOB_ROOT = Path(tempfile.gettempdir()) / f"shmcoll-reltest-{os.getpid()}"
PREFIX = "shmcoll-"


# -- infrastructure ------------------------------------------------------------

_ctx = None


def forkserver():
    global _ctx
    if _ctx is None:
        _ctx = multiprocessing.get_context("forkserver")
        _ctx.set_forkserver_preload(["tests.faults"])
    return _ctx


def record(name: str, data) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


def names_rank(message: str, rank: int) -> bool:
    """True if ``message`` names ``rank`` as a rank ('rank 2', 'rank(s) 0, 2', 'ranks [2]' ...)."""
    return re.search(rf"\branks?(?:\(s\))?\s*[\[(]?\s*(?:\d+\s*,\s*)*{rank}\b", message) is not None


class Job(Ranks):
    """``world`` ranks running ``faults.SCENARIO``; see tests/faults.py for spec fields.

    ``launcher``: "fork" (a forkserver child: milliseconds to start, reaped at once by the server,
    as by torchrun's agent) or "popen" (a fresh interpreter, reaped only by this test).
    """

    _count = 0

    def __init__(self, scenario: str, world: int, args: dict | None = None, env: dict | None = None,
                 store: str = "tcp", launcher: str = "fork", shm_dir: str | None = None):
        Job._count += 1
        JOB_ROOT.mkdir(parents=True, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix=f"{scenario}-{Job._count}-", dir=JOB_ROOT)
        if shm_dir is None:
            shm_dir = str(SHM_ROOT / os.path.basename(self.dir))
            os.makedirs(shm_dir)
        self.shm_dir = shm_dir
        self._store = None
        env = {"SHMCOLL_SHM_DIR": shm_dir, "OMP_NUM_THREADS": "1", **(env or {})}
        if store == "tcp":  # hosted here, like torchrun's agent store: survives any rank
            self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
            store_spec = f"tcp:127.0.0.1:{self._store.port}"
        else:  # env://: rank 0 hosts the store
            store_spec = "env"
            env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)})

        common = {"world": world, "store": store_spec, "dir": self.dir, "args": args or {}, "env": env}

        def fork(rank: int):
            spec = {**common, "rank": rank, "env": {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}}
            proc = forkserver().Process(target=faults.forked, args=(scenario, spec), daemon=False)
            proc.start()
            return proc

        self.started = time.monotonic()
        if launcher == "fork":
            super().__init__(world, self.dir, fork=fork)
        else:  # the rank comes from RANK, which Ranks sets
            super().__init__(world, self.dir, "tests.faults", [scenario, json.dumps(common)], env=env,
                             rendezvous=False)
        RANK_PIDS.update(self.pid(r) for r in range(world))

    def finish(self, timeout: float) -> list[int]:
        hung = super().finish(timeout)
        self._store = None
        return hung

    # results -------------------------------------------------------------------

    def report(self, rank: int) -> dict | None:
        path = os.path.join(self.dir, f"rank{rank}.json")
        return json.load(open(path)) if os.path.exists(path) else None

    def log(self, rank: int, tail: int | None = 3000) -> str:
        return super().log(rank, tail)

    def marker(self, name: str, rank: int) -> float | None:
        path = os.path.join(self.dir, f"{name}.{rank}")
        try:
            return json.load(open(path))["time"]
        except (OSError, ValueError):
            return None

    def wait_marker(self, name: str, rank: int, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.marker(name, rank)
            if value is not None:
                return value
            time.sleep(0.005)
        return None

    def leftovers(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.shm_dir) if n.startswith(PREFIX))
        except FileNotFoundError:
            return []


RANK_PIDS: set[int] = set()  # every rank this module started (segment names carry the creator's pid)


@pytest.fixture(scope="module", autouse=True)
def _session_dirs():
    SHM_ROOT.mkdir(parents=True, exist_ok=True)
    yield
    shutil.rmtree(SHM_ROOT, ignore_errors=True)
    shutil.rmtree(JOB_ROOT, ignore_errors=True)
    # Every job points SHMCOLL_SHM_DIR elsewhere; nothing of ours may be in /dev/shm itself.
    stray = [n for n in os.listdir("/dev/shm")
             if re.fullmatch(rf"{PREFIX}(\d+)-.*", n) and int(n[len(PREFIX):].split("-")[0]) in RANK_PIDS]
    assert not stray, f"segments of this module's ranks left in /dev/shm: {stray}"


# -- 1. a peer dies in the middle of a collective loop -----------------------------

@pytest.mark.parametrize("victim", [2, 0])
@pytest.mark.parametrize("numel,threads,single_copy", [(2, 1, "auto"), (1 << 20, 1, "1"), (1 << 20, 1, "0"),
                                                       (1 << 20, 3, "auto")],
                         ids=["8B", "4MiB-single-copy", "4MiB-copy", "4MiB-3lanes"])
def test_dead_peer_is_reported_quickly(numel, threads, single_copy, victim):
    """SIGKILL one of 3 ranks mid-loop: the survivors raise naming it within 2 s (timeout 60 s), exit 0;
    with 3 threads per rank every lane of the all_reduce must notice; with single copy, a survivor reading
    the victim's buffer as it dies too."""
    kill_at = 300 if numel == 2 else 30
    job = Job("dead_peer", 3, args={"victim": victim, "kill_at": kill_at, "numel": numel, "timeout": 60},
              env={"SHMCOLL_THREADS": str(threads), "SHMCOLL_SINGLE_COPY": single_copy})
    survivors = [r for r in range(3) if r != victim]
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(job.dir, "kill_time")) and time.monotonic() < deadline \
            and job.exitcode(victim) is None:
        time.sleep(0.01)
    hung = job.wait(10, survivors)  # well under the 60 s group timeout
    job.finish(1)
    assert os.path.exists(os.path.join(job.dir, "kill_time")), f"the victim never reached its kill:\n{job.logs()}"
    killed = float(open(os.path.join(job.dir, "kill_time")).read())
    assert not hung, f"ranks {hung} still blocked 10 s after rank {victim} was killed:\n{job.logs()}"
    assert job.exitcode(victim) == -signal.SIGKILL
    figures = {}
    for r in survivors:
        rep = job.report(r)
        assert rep is not None and "error" in rep, f"rank {r} raised nothing:\n{job.logs()}"
        err = rep["error"]
        figures[r] = {"detected_after_s": round(err["time"] - killed, 3), "type": err["type"],
                      "message": err["message"], "destroy_s": rep.get("destroy_s")}
        assert names_rank(err["message"], victim), f"rank {r}: the error does not name rank {victim}: {err}"
        assert err["time"] - killed < 2.0, f"rank {r} noticed the death after {err['time'] - killed:.2f} s"
        assert "RuntimeError" in err["mro"], err
        assert rep["wrong_results"] == 0
        assert job.exitcode(r) == 0, f"rank {r} exit {job.exitcode(r)}:\n{job.log(r)}"
    record(f"dead_peer-{numel * 4}B-{threads}threads-single-copy-{single_copy}-victim{victim}", figures)
    assert job.leftovers() == []


@pytest.mark.parametrize("loop, threads", [("gather", 1), ("stream", 1), ("gather", 3)],
                         ids=["gather", "stream", "gather-3lanes"])
def test_dead_peer_while_its_buffer_is_read(loop, threads):
    """Single copy: rank 0 of 3 dies (SIGKILL from a timer) inside a loop of 48 MiB all_gathers, or of 64 MiB
    messages from it to each peer, where its peers spend most of their time reading its buffer: each raises
    naming it, within 2 s; also where the reads are split over 3 lanes (a lane thread's failed read)."""
    # 64 MiB messages: each read takes long enough for the kill to land in one (12 MiB ones were read whole).
    job = Job("dead_peer", 3, args={"victim": 0, "kill_at": 5, "numel": (4 if loop == "gather" else 16) << 20,
                                    "timeout": 60, loop: True},
              env={"SHMCOLL_SINGLE_COPY": "1", "SHMCOLL_THREADS": str(threads)})
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(job.dir, "kill_time")) and time.monotonic() < deadline:
        time.sleep(0.01)
    hung = job.wait(10, [1, 2])
    job.finish(1)
    killed = float(open(os.path.join(job.dir, "kill_time")).read())
    assert not hung, f"ranks {hung} still blocked 10 s after rank 0 was killed:\n{job.logs()}"
    messages = []
    for r in (1, 2):
        err = job.report(r)["error"]
        messages.append(err["message"])
        assert names_rank(err["message"], 0) and err["time"] - killed < 2.0, err
        assert job.report(r)["wrong_results"] == 0 and job.exitcode(r) == 0
    record(f"dead_peer_while_read-{loop}-{threads}threads", {"messages": messages})
    assert job.leftovers() == []


def test_dead_peer_is_reported_when_the_launcher_has_not_reaped_it():
    """Same, with fresh interpreters whose parent does not reap the victim at once.

    Launchers that wait for their ranks in order (``for p in procs: p.wait()``,
    like tests/harness.py) leave a dead rank a zombie until the ranks before it
    exit; the survivors must still see that it died.
    """
    victim = 2
    job = Job("dead_peer", 3, args={"victim": victim, "kill_at": 300, "numel": 2, "timeout": 60},
              launcher="popen")
    kill_file = os.path.join(job.dir, "kill_time")
    deadline = time.monotonic() + 90
    while not os.path.exists(kill_file) and time.monotonic() < deadline and job.running([0, 1]):
        time.sleep(0.01)
    assert os.path.exists(kill_file), f"the victim never reached its kill:\n{job.logs()}"
    hung = job.wait(6, [0, 1])  # reaps 0 and 1 only; rank 2 stays a zombie meanwhile
    zombie = open(f"/proc/{job.pid(victim)}/stat").read().rsplit(")", 1)[1].split()[0] == "Z" \
        if os.path.exists(f"/proc/{job.pid(victim)}/stat") else None
    job.finish(1)
    killed = float(open(kill_file).read())
    assert not hung, (f"ranks {hung} still blocked 6 s after rank {victim} was SIGKILLed (it was a zombie: "
                      f"{zombie}): kill(pid, 0) succeeds on an unreaped process, so it looks alive")
    for r in (0, 1):
        err = job.report(r)["error"]
        assert names_rank(err["message"], victim) and err["time"] - killed < 2.0, err
        assert job.exitcode(r) == 0, job.logs()
    assert job.exitcode(victim) == -signal.SIGKILL
    assert job.leftovers() == []


# -- 2. a rank never calls the collective ---------------------------------------------

TIMEOUT_KINDS = ["all_reduce", "broadcast", "all_gather", "barrier", "all_reduce_over_lanes"]
TIMEOUT_S = 3.0
# The all_reduce over lanes: 4 MiB on three lanes, started by the compiled front (_front.SmallCollectives).
LANES_NUMEL = 1 << 20


@pytest.fixture(scope="module")
def timeout_jobs():
    """All kinds at once (the ranks mostly sleep): rank 2 skips collective #6.

    For broadcast, rank 2 is the root: a broadcast may complete on the root and
    on the ranks that got the data without waiting for a missing non-root (MPI
    semantics); the late rank is then caught at the next collective.
    """
    jobs = {kind: Job("missing_rank", 3, args={"kind": kind.removesuffix("_over_lanes"), "missing": 2,
                                              "timeout": TIMEOUT_S, "root": 2,
                                              "numel": LANES_NUMEL if kind.endswith("_over_lanes") else 1000},
                      env={"SHMCOLL_THREADS": "3"} if kind.endswith("_over_lanes") else None)
            for kind in TIMEOUT_KINDS}
    for job in jobs.values():
        job.finish(TIMEOUT_S + 20)
    record("timeout", {kind: [job.report(r) for r in range(3)] for kind, job in jobs.items()})
    return jobs


@pytest.mark.parametrize("kind", TIMEOUT_KINDS)
def test_missing_rank_times_out_with_a_clear_message(timeout_jobs, kind):
    job = timeout_jobs[kind]
    problems = []
    for r in (0, 1):
        rep = job.report(r)
        assert rep is not None, job.logs()
        assert "error" in rep, f"rank {r}: {kind} returned after {rep.get('returned_after')} s without rank 2"
        err = rep["error"]
        msg = err["message"]
        if not TIMEOUT_S - 0.2 <= err["elapsed"] <= TIMEOUT_S + 1.0:
            problems.append(f"rank {r} raised after {err['elapsed']:.2f} s (timeout {TIMEOUT_S} s)")
        if not names_rank(msg, 2):
            problems.append(f"rank {r}: the message does not name the missing rank 2")
        collective = kind.removesuffix("_over_lanes")
        if collective.replace("_", "") not in msg.replace("_", "").lower():
            problems.append(f"rank {r}: the message does not name the collective {collective}")
        if not re.search(r"#\s*6\b", msg):
            problems.append(f"rank {r}: the message does not give the sequence number (#6)")
        if kind != "barrier":
            if "float32" not in msg:
                problems.append(f"rank {r}: the message does not name the dtype (float32)")
            numel = LANES_NUMEL if kind.endswith("_over_lanes") else 1000
            if not re.search(rf"\b{numel}\b|\b{4 * numel} bytes", msg):
                problems.append(f"rank {r}: the message does not give the count ({numel} elements)")
        assert "RuntimeError" in err["mro"]
    assert not problems, "\n".join(problems) + f"\nmessage: {job.report(0)['error']['message']}"
    assert all(job.exitcode(r) == 0 for r in range(3)), job.logs()
    assert job.leftovers() == []


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_a_failed_all_reduce_under_ddp_raises_from_backward(sparse):
    """The error reaches DDP through the Work's future, which DDP reads from C++."""
    job = Job("ddp_missing_rank", 3, args={"sparse": sparse, "missing": 2, "timeout": TIMEOUT_S})
    job.finish(TIMEOUT_S + 30)
    for r in (0, 1):
        rep = job.report(r)
        assert rep is not None, job.logs()
        assert "error" in rep, f"rank {r}: backward returned after {rep.get('returned_after')} s without rank 2"
        err = rep["error"]
        assert "RuntimeError" in err["mro"], err
        assert "Timed out" in err["message"] and "all_reduce" in err["message"], err["message"]
        assert names_rank(err["message"], 2), err["message"]
        assert TIMEOUT_S - 0.2 <= err["elapsed"] <= TIMEOUT_S + 2.0, err
    assert all(job.exitcode(r) == 0 for r in range(3)), job.logs()
    assert job.leftovers() == []


def test_a_window_consumer_failing_on_one_rank_fails_the_others_quickly():
    job = Job("window_consumer_fails", 3, args={"failing": 1, "timeout": 30},
              env={"SHMCOLL_CHUNK_BYTES": "4096"})
    job.finish(60)
    failed = job.report(1)
    assert failed is not None and "the consumer failed" in failed["error"]["message"], job.logs()
    for r in (0, 2):
        err = job.report(r)["error"]
        assert err["type"] == "PeerGaveUpError" and "rank(s) 1 gave up" in err["message"], err
        assert err["elapsed"] < 2.0, err  # a slice or two, not the 30 s timeout
    assert all(job.exitcode(r) == 0 for r in range(3)), job.logs()
    assert job.leftovers() == []


@pytest.mark.parametrize("numel", [1000, 1 << 22], ids=["4KB", "16MB"])
def test_a_rank_late_after_the_others_timed_out_learns_they_gave_up(numel):
    """The ranks that timed out leave the collective part-way: the late rank's wait must say so within a slice
    or two, naming the rank that gave up, not wait out the timeout and call it "did not reach it"."""
    timeout = 4
    job = Job("late_after_timeout", 2, args={"late": 1, "timeout": timeout, "numel": numel})
    job.finish(3 * timeout + 30)
    first = job.report(0)["error"]
    assert first["type"] == "PeerTimeoutError", first
    late = job.report(1)
    assert "error" in late, f"the late rank returned after {late.get('returned_after')} s"
    assert late["error"]["type"] == "PeerGaveUpError" and "rank(s) 0 gave up" in late["error"]["message"], late
    assert late["error"]["elapsed"] < 2.0, late  # a slice or two, not the timeout
    assert all(job.exitcode(r) == 0 for r in range(2)), job.logs()
    assert job.leftovers() == []


def test_destroy_returns_when_the_peers_left_an_unmatched_collective():
    timeout = 30
    job = Job("destroy_beside_unmatched", 2, args={"lonely": 0, "timeout": timeout})
    job.finish(timeout + 30)
    lonely = job.report(0)
    assert lonely["destroyed_after"] < 2.0, lonely  # not the 30 s timeout
    assert lonely["error"]["type"] == "PeerLeftError" and "rank(s) 1 closed the group" in lonely["error"]["message"], \
        lonely
    assert job.report(1)["destroyed_after"] < 2.0
    assert all(job.exitcode(r) == 0 for r in range(2)), job.logs()
    assert job.leftovers() == []


# -- 3. nothing is left behind in /dev/shm ----------------------------------------

def _phase(job: Job, rank: int) -> str:
    """Where rank's life stood when it was killed, from its markers."""
    order = [("exit", "exited"), ("destroy", "destroying"), ("ready", "collectives"),
             ("unlinked", "init, after unlink"), ("created", "init, segment created, not yet unlinked"),
             ("creating", "init, creating the segment"), ("init", "init, before the segment"),
             ("start", "before init")]
    for marker, phase in order:
        if job.marker(marker, rank) is not None:
            return phase
    return "starting"


KILL_TRIALS = 100
PARALLEL_TRIALS = 6
TRIAL_TIMEOUT = 2.0  # group (and store) timeout of the kill trials


def _rank_timeline(job: Job, rank: int) -> dict:
    start = job.marker("start", rank)
    return {m: job.marker(m, rank) - start for m in ("init", "created", "unlinked", "ready", "destroy", "exit")
            if job.marker(m, rank) is not None}


def test_random_kills_leave_no_segment():
    """SIGKILL one of 2 ranks at a random moment, 100 times, 6 jobs at a time; count leftovers per job.

    Kill times are random on the victim's own clock: 60 uniform over the whole
    life of a rank (measured on an undisturbed job), 40 on the creator uniform
    over the 3 ms after it starts creating the segment (init_process_group,
    where the segment has a name for a moment; too short for the 60 to hit
    reliably).
    """
    rng = random.Random(int(os.environ.get("SHMCOLL_RELIABILITY_SEED", "1234")))
    args = {"iters": 20, "timeout": TRIAL_TIMEOUT}
    probe = Job("churn", 2, args=args)
    assert probe.finish(30) == [], probe.logs()
    timelines = [_rank_timeline(probe, r) for r in range(2)]
    life = max(t["exit"] for t in timelines)
    plan = [("start", rng.randrange(2), rng.uniform(0, life)) for _ in range(60)] + \
        [("creating", 0, rng.uniform(0, 0.003)) for _ in range(KILL_TRIALS - 60)]
    rng.shuffle(plan)
    trials, done = [], []
    started = time.monotonic()
    while plan or trials:
        while plan and len(trials) < PARALLEL_TRIALS:
            aim, victim, delay = plan.pop()
            job = Job("churn", 2, args={**args, "victim": victim, "kill_after": delay, "anchor": aim})
            trials.append({"job": job, "victim": victim, "delay": delay, "aim": aim, "t0": time.monotonic()})
        for trial in list(trials):
            job = trial["job"]
            if job.running() and time.monotonic() - trial["t0"] < TRIAL_TIMEOUT + 8:
                continue
            trial["hung"] = job.finish(0)
            trial["killed"] = job.exitcode(trial["victim"]) == -signal.SIGKILL
            trial["phase"] = _phase(job, trial["victim"]) if trial["killed"] else "not killed (finished first)"
            trial["survivor_exit"] = job.exitcode(1 - trial["victim"])
            trial["leftovers"] = job.leftovers()
            done.append(trial)
            trials.remove(trial)
        time.sleep(0.005)
    elapsed = time.monotonic() - started
    killed = [t for t in done if t["killed"]]
    leaked = [t for t in done if t["leftovers"]]
    hung = [t for t in done if t["hung"]]
    summary = {"trials": len(done), "killed": len(killed), "seconds": round(elapsed, 1),
               "rank_timeline_s": timelines, "phases": Counter(t["phase"] for t in done),
               "leftover_segments": sum(len(t["leftovers"]) for t in done),
               "phases_by_aim": {aim: Counter(t["phase"] for t in done if t["aim"] == aim)
                                 for aim in ("start", "creating")},
               "leaking_trials": [(t["aim"], t["phase"], t["victim"], round(t["delay"], 4)) for t in leaked],
               "hung_trials": [(t["phase"], t["victim"]) for t in hung],
               "survivor_exit_codes": Counter(str(t.get("survivor_exit")) for t in killed)}
    record("kill_trials", summary)
    assert len(killed) >= 50, summary
    assert not leaked, f"{len(leaked)} trial(s) left segments: {summary}"
    assert not hung, f"survivors hung in {len(hung)} trial(s): {summary}"


@pytest.mark.parametrize("who,point,sig", [
    (0, "after_create", signal.SIGKILL),  # the creator dies before it could publish or unlink
    (0, "while_waiting", signal.SIGTERM),  # e.g. torchrun/k8s stopping the job during init
    (0, "while_waiting", signal.SIGINT),  # Ctrl-C in a terminal
], ids=["sigkill-after-create", "sigterm-while-waiting", "sigint-while-waiting"])
def test_kill_inside_the_creation_window_leaves_no_segment(who, point, sig):
    """Deterministic versions of the unlucky random kill: the creator dies while the file has a name."""
    job = Job("targeted_kill", 2, args={"who": who, "point": point, "sig": int(sig), "timeout": 3})
    hung = job.finish(20)
    assert job.marker("created", 0) is not None, job.logs()
    record(f"targeted-{point}-{signal.Signals(sig).name}",
           {"leftovers": job.leftovers(), "exit": [job.exitcode(r) for r in range(2)], "hung": hung})
    assert job.leftovers() == [], (f"{signal.Signals(sig).name} of rank {who} at {point} left "
                                   f"{job.leftovers()} in SHMCOLL_SHM_DIR")
    assert not hung


@pytest.mark.parametrize("scenario,code", [("normal_exit", 0), ("user_exception", 3)])
def test_clean_and_failed_exits_leave_no_segment(scenario, code):
    job = Job(scenario, 2)
    assert job.finish(30) == [], job.logs()
    assert [job.exitcode(r) for r in range(2)] == [code, code], job.logs()
    assert job.leftovers() == []


def _torchrun(shm_dir: str, job_dir: str, slow_attach: float = 0.0):
    spec = {"dir": job_dir, "store": "env", "args": {"slow_attach": slow_attach}}
    log = open(os.path.join(job_dir, "torchrun.log"), "w")
    return subprocess.Popen(torchrun_command(2, "tests.faults", "torchrun_rank", json.dumps(spec),
                                             options=["--shutdown-timeout=5"]),
                            env=rank_environment({"SHMCOLL_SHM_DIR": shm_dir}), cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _worker_pids(job_dir: str) -> list[int]:
    pids = []
    for r in range(2):
        try:
            pids.append(json.load(open(os.path.join(job_dir, f"start.{r}")))["pid"])
        except (OSError, ValueError, KeyError):
            pass
    return pids


@pytest.mark.parametrize("when", ["collectives", "init"])
def test_ctrl_c_through_torchrun_leaves_no_segment(when):
    """SIGINT to torchrun (which forwards it, then SIGKILLs after --shutdown-timeout)."""
    job_dir = tempfile.mkdtemp(prefix="torchrun-", dir=JOB_ROOT)
    shm_dir = str(SHM_ROOT / os.path.basename(job_dir))
    os.makedirs(shm_dir)
    proc = _torchrun(shm_dir, job_dir, slow_attach=30.0 if when == "init" else 0.0)
    marker = (lambda: os.path.exists(os.path.join(job_dir, "created.0"))) if when == "init" else \
        (lambda: all(os.path.exists(os.path.join(job_dir, f"ready.{r}")) for r in range(2)))
    deadline = time.monotonic() + 60
    while not marker() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    reached = marker()
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    log = open(os.path.join(job_dir, "torchrun.log"), errors="replace").read()[-4000:]
    assert reached, f"the job never reached the {when} phase:\n{log}"
    left = sorted(os.listdir(shm_dir))
    record(f"torchrun-ctrl-c-{when}", {"torchrun_exit": code, "leftovers": left,
                                       "sigkill_needed": "forcefully exiting via" in log})
    RANK_PIDS.update(_worker_pids(job_dir))
    stray = [pid for pid in _worker_pids(job_dir) if os.path.exists(f"/proc/{pid}")]
    assert not stray, f"workers {stray} outlived torchrun"
    assert code != 0
    assert left == [], f"Ctrl-C during {when} left {left}:\n{log}"


# -- 4. mismatched collectives ------------------------------------------------------

def _c(kind, numel=100, dtype="float32", root=0, op="SUM", asynchronous=False, warm=False):
    # warm: every all_reduce of the case made once before it (faults.mismatch), so that the call takes a fast path
    return {"kind": kind, "numel": numel, "dtype": dtype, "root": root, "op": op, "async": asynchronous,
            "warm": warm}


AR, BC, AG, BAR = (lambda **k: _c("all_reduce", **k)), (lambda **k: _c("broadcast", **k)), \
    (lambda **k: _c("all_gather", **k)), (lambda **k: _c("barrier", numel=0))
AGT = lambda **k: _c("all_gather_into_tensor", **k)  # noqa: E731
# name: (per-rank calls for 3 ranks, patterns naming the first call, patterns naming the second call)
MISMATCH_CASES = {
    "op_sum_vs_max": ([AR(), AR(op="MAX"), AR()], ["sum"], ["max"]),
    "dtype_float32_vs_float64": ([AR(), AR(), AR(dtype="float64")], ["float32"], ["float64"]),
    "dtype_float32_vs_int32_same_bytes": ([AR(), AR(dtype="int32"), AR()], ["float32"], ["int32"]),
    "count_100_vs_101": ([AR(), AR(numel=101), AR()], ["100"], ["101"]),
    "count_small_vs_large_algorithm": ([AR(), AR(), AR(numel=300_000)], ["100"], ["300000"]),
    "count_empty_vs_100": ([AR(), AR(numel=0), AR()], ["100"], [r"\b0 (elements|bytes)"]),
    "broadcast_root_0_vs_1": ([BC(root=0), BC(root=1), BC(root=0)], ["root 0"], ["root 1"]),
    "broadcast_roots_crossed": ([BC(root=1), BC(root=0), BC(root=1)], ["root 1"], ["root 0"]),
    "broadcast_count": ([BC(), BC(numel=200), BC()], [r"\b(100 elements|400 bytes)"],
                        [r"\b(200 elements|800 bytes)"]),
    "broadcast_dtype_same_bytes": ([BC(), BC(dtype="int32"), BC()], ["float32"], ["int32"]),
    "all_gather_count": ([AG(), AG(), AG(numel=101)], [r"\b(100 elements|400 bytes)"],
                         [r"\b(101 elements|404 bytes)"]),
    "all_gather_dtype_same_bytes": ([AG(), AG(dtype="int32"), AG()], ["float32"], ["int32"]),
    "all_reduce_vs_broadcast_root": ([BC(root=0), AR(), AR()], ["broadcast"], ["all_reduce"]),
    "all_reduce_vs_broadcast_nonroot": ([AR(), BC(root=0), AR()], ["all_reduce"], ["broadcast"]),
    "all_reduce_vs_barrier": ([AR(), BAR(), AR()], ["all_reduce"], ["barrier"]),
    "all_reduce_vs_all_gather": ([AR(), AR(), AG()], ["all_reduce"], ["all_gather"]),
    "broadcast_vs_barrier": ([BC(root=0), BAR(), BAR()], ["broadcast"], ["barrier"]),
    "all_gather_vs_broadcast_root": ([AG(), AG(), BC(root=2)], ["all_gather"], ["broadcast"]),
    "barrier_vs_all_gather": ([BAR(), AG(), AG()], ["barrier"], ["all_gather"]),
    # async_op=True: small ones run inline, large ones on the progress thread; wait() raises either way
    "async_all_reduce_vs_broadcast": ([AR(asynchronous=True), BC(root=0, asynchronous=True), AR(asynchronous=True)],
                                      ["all_reduce"], ["broadcast"]),
    # after a warm-up: small collectives run whole in compiled code (shmcoll._front.SmallCollectives)
    "warm_op_sum_vs_max": ([AR(warm=True), AR(op="MAX", warm=True), AR(warm=True)], ["sum"], ["max"]),
    "warm_count_100_vs_101": ([AR(warm=True), AR(numel=101, warm=True), AR(warm=True)], ["100"], ["101"]),
    "warm_dtype_float32_vs_int32_same_bytes": ([AR(warm=True), AR(dtype="int32", warm=True), AR(warm=True)],
                                               ["float32"], ["int32"]),
    "warm_all_reduce_vs_broadcast_nonroot": ([AR(warm=True), BC(root=0, warm=True), AR(warm=True)],
                                             ["all_reduce"], ["broadcast"]),
    "warm_broadcast_count": ([BC(warm=True), BC(numel=200, warm=True), BC(warm=True)],
                             [r"\b(100 elements|400 bytes)"], [r"\b(200 elements|800 bytes)"]),
    "warm_broadcast_roots_crossed": ([BC(root=1, warm=True), BC(root=0, warm=True), BC(root=1, warm=True)],
                                     ["root 1"], ["root 0"]),
    "warm_all_gather_into_tensor_count": ([AGT(warm=True), AGT(warm=True), AGT(numel=101, warm=True)],
                                          [r"\b(100 elements|400 bytes)"], [r"\b(101 elements|404 bytes)"]),
    "warm_async_all_reduce_vs_barrier": ([AR(asynchronous=True, warm=True), BAR(), AR(asynchronous=True, warm=True)],
                                         ["all_reduce"], ["barrier"]),
    "async_large_all_reduce_vs_all_gather": ([AR(numel=300_000, asynchronous=True)] * 2
                                             + [AG(numel=300_000, asynchronous=True)], ["all_reduce"], ["all_gather"]),
}
MISMATCH_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def mismatch_job():
    cases = {name: calls for name, (calls, _, _) in MISMATCH_CASES.items()}
    job = Job("mismatch", 3, args={"cases": cases, "timeout": MISMATCH_TIMEOUT})
    hung = job.finish(len(cases) * (MISMATCH_TIMEOUT + 3) + 30)
    record("mismatch", {r: job.report(r) for r in range(3)})
    job.hung = hung
    return job


@pytest.mark.parametrize("case", list(MISMATCH_CASES))
def test_mismatched_collectives_are_detected(mismatch_job, case):
    _, first, second = MISMATCH_CASES[case]
    job = mismatch_job
    problems = []
    for r in range(3):
        rep = job.report(r)
        res = (rep or {}).get("cases", {}).get(case)
        if res is None:
            problems.append(f"rank {r}: no result (hung or crashed; exit {job.exitcode(r)})")
            continue
        call = res["call"]
        what = f"rank {r} ({call['kind']}"
        what += f" root {call['root']})" if call["kind"] == "broadcast" else ")"
        err = res.get("error")
        if err is None:
            right = "right" if res.get("outputs_right") else f"WRONG {res.get('first_values')}"
            problems.append(f"{what}: returned normally after {res['elapsed']:.3f} s, outputs {right}")
            continue
        missing = [pattern for pattern in first + second if not re.search(pattern, err["message"], re.IGNORECASE)]
        if err["type"] != "CollectiveError" or missing:
            problems.append(f"{what}: {err['type']} after {err['elapsed']:.2f} s without {missing}: {err['message']}")
        if err["elapsed"] > MISMATCH_TIMEOUT + 1.0:
            problems.append(f"{what}: took {err['elapsed']:.2f} s")
        if not res.get("outputs_intact"):
            problems.append(f"{what}: raised but its tensors were modified")
        if call.get("async") and not err.get("by_wait"):
            problems.append(f"{what}: an asynchronous call raised at the call, not from wait()")
    assert not problems, "\n".join(problems)


def test_mismatches_leave_the_backend_usable(mismatch_job):
    assert mismatch_job.hung == [], mismatch_job.logs()
    for r in range(3):
        assert mismatch_job.report(r).get("after_all") == [3.0] * 10, mismatch_job.logs()
    assert mismatch_job.leftovers() == []


# -- 5. bad input ---------------------------------------------------------------------

# case: words (any case) the message must contain
BAD_INPUT = {
    "meta_tensor": ["meta", "cpu"],
    "cuda_tensor": ["cuda", "cpu"],
    "sparse_csr_tensor": ["sparse", "csr"],
    "sparse_max": ["sparse", "SUM", "MAX"],
    "non_tensor": ["tensor", "list"],
    "all_gather_short_list": [r"\b2\b", r"\b3\b"],
    "all_gather_long_list": [r"\b4\b", r"\b3\b"],
    "all_gather_wrong_size": [r"\b5\b", r"\b4\b"],
    "all_gather_into_tensor_wrong_size": [r"\b15\b", r"\b12\b"],
    "all_gather_into_tensor_wrong_dtype": ["float64", "float32"],
    "reduce_scatter_tensor_wrong_size": [r"\b15\b", r"\b12\b"],
    "reduce_scatter_tensor_wrong_dtype": ["float64", "float32"],
    "all_gather_into_tensor_meta_output": ["meta", "cpu"],
    "broadcast_root_too_big": ["root", r"\b3\b"],
    "broadcast_root_negative": ["root", "-1"],
    "band_on_float": ["band", "float"],
    "avg_on_bool": ["avg", "bool"],
    "min_on_complex": ["min", "complex"],
    "unsupported_dtype_uint32": ["uint32"],
}


@pytest.fixture(scope="module")
def bad_input_jobs():
    jobs = {backend: Job("bad_input", 3, args={"backend": backend}) for backend in ("shm", "gloo")}
    for job in jobs.values():
        job.hung = job.finish(60)
    table = {}
    for case in BAD_INPUT:
        row = table[case] = {}
        for backend, job in jobs.items():
            res = ((job.report(0) or {}).get("cases") or {}).get(case, {})
            err = res.get("error")
            row[backend] = f"{err['type']}: {err['message']}" if err else "no error"
    record("bad_input_messages", table)
    record("bad_input", {b: [j.report(r) for r in range(3)] for b, j in jobs.items()})
    return jobs


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_gives_a_clear_error(bad_input_jobs, case):
    if case == "cuda_tensor" and not torch.cuda.is_available():
        pytest.skip("no CUDA here; meta_tensor covers non-CPU devices")
    job = bad_input_jobs["shm"]
    assert job.hung == [], job.logs()
    for r in range(3):
        res = job.report(r)["cases"][case]
        err = res.get("error")
        assert err is not None, f"rank {r}: {case} was accepted"
        assert {"ValueError", "TypeError", "RuntimeError"} & set(err["mro"]), err
        missing = [w for w in BAD_INPUT[case] if not re.search(w, err["message"], re.IGNORECASE)]
        assert not missing, f"rank {r}: the message lacks {missing}: {err['message']}"
        assert err["elapsed"] < 1.0, f"rank {r}: took {err['elapsed']:.2f} s to refuse"
        assert res["group_still_works"], f"rank {r}: the group was broken by the refused call: {res}"


def test_bad_input_on_one_rank_does_not_hang_the_others(bad_input_jobs):
    job = bad_input_jobs["shm"]
    assert job.hung == [], job.logs()
    bad = job.report(1)["asymmetric"]["error"]
    assert bad["type"] == "ValueError" and bad["elapsed"] < 1.0, bad
    for r in (0, 2):
        err = job.report(r)["asymmetric"].get("error")
        assert err is not None, f"rank {r} returned from all_gather without rank 1"
        assert err["elapsed"] < 2.0 + 1.0, err
        assert names_rank(err["message"], 1), err
    assert all(job.exitcode(r) == 0 for r in range(3)), job.logs()


# -- 6. teardown and re-initialisation ---------------------------------------------------

def test_destroy_and_init_again_twice():
    job = Job("reinit", 2, args={"cycles": 3})
    assert job.finish(60) == [], job.logs()
    for r in range(2):
        rep = job.report(r)
        assert rep is not None and "uncaught" not in rep, job.logs()
        cycles = rep["cycles"]
        assert len(cycles) == 3 and all(c["ok"] for c in cycles), cycles
        before = rep["before"]
        for i, c in enumerate(cycles):
            after = c["after"]
            assert c["during"]["maps"], "the arena is not mapped while the group lives?"
            assert after["maps"] == [], f"cycle {i}: the arena is still mapped after destroy: {after['maps']}"
            assert after["fds"] == [] and after["shm_entries"] == []
            assert not [t for t in after["py_threads"] if t != "MainThread"], after["py_threads"]
            assert after["os_threads"] == before["os_threads"], (
                f"cycle {i}: {after['os_threads']} OS threads after destroy, {before['os_threads']} before init: "
                f"{after['os_thread_names']}")
    record("reinit", {r: job.report(r) for r in range(2)})
    assert job.leftovers() == []


# -- 7. /dev/shm too small ------------------------------------------------------------------

@pytest.fixture
def tiny_tmpfs():
    mount = tempfile.mkdtemp(prefix="tiny-shm-", dir=JOB_ROOT.parent)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", mount],
                            capture_output=True, text=True)
    if result.returncode != 0:
        os.rmdir(mount)
        pytest.fail(f"cannot mount a 1 MiB tmpfs (CI runs as root): {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", mount], check=False)
        os.rmdir(mount)


def _arena_bytes(local_size: int):
    """Segment size shmcoll will ask for with default settings (its layout helpers have changed names)."""
    from shmcoll._env import read_settings

    settings = read_settings({})
    if hasattr(shm_arena, "layout"):
        return shm_arena.layout(local_size, settings.chunk_bytes, settings.p2p_bytes).total
    if hasattr(shm_arena, "arena_bytes"):
        return shm_arena.arena_bytes(local_size, settings.chunk_bytes)
    return None


@pytest.mark.parametrize("store", ["tcp", "env"], ids=["agent-store", "rank0-store"])
def test_too_small_shm_fails_clearly_on_every_rank(tiny_tmpfs, store):
    world = 3
    job = Job("small_shm", world, args={"timeout": 60}, store=store, shm_dir=tiny_tmpfs)
    hung = job.finish(10)
    stat = os.statvfs(tiny_tmpfs)
    free = stat.f_bavail * stat.f_frsize
    needed = _arena_bytes(world)
    reports = {r: job.report(r) for r in range(world)}
    record(f"small_shm-{store}", {"hung": hung, "needed": needed, "free": free, "reports": reports})
    problems = [f"rank {r} still waiting 10 s after start (group timeout 60 s)" for r in hung]
    for r, rep in reports.items():
        if r in hung:
            continue
        err = (rep or {}).get("error") or (rep or {}).get("uncaught")
        if err is None:
            problems.append(f"rank {r}: no error reported (exit {job.exitcode(r)})")
            continue
        msg = err["message"]
        missing = [w for w in (str(needed), str(free), "SHMCOLL_CHUNK_BYTES") if w not in msg]
        if needed is None:  # layout unknown to this test: any figure above the slots' bytes will do
            numbers = [int(n) for n in re.findall(r"\d{6,}", msg)]
            missing = ([] if any(n >= 2 * world * 512 * 1024 for n in numbers) else ["needed bytes"]) + \
                [w for w in (str(free), "SHMCOLL_CHUNK_BYTES") if w not in msg]
        if missing:
            problems.append(f"rank {r}: {err['type']} lacks {missing}: {msg[:300]}")
    assert not problems, "\n".join(problems)
    assert os.listdir(tiny_tmpfs) == []
