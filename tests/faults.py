"""Fault scenarios for tests/test_reliability.py, run inside the rank processes.

A rank runs one scenario function ``fn(rank: Rank, **args)`` and reports a
JSON dict. Ranks start in one of two ways:

* ``forked(scenario, spec)``: the target of a ``multiprocessing`` forkserver
  process whose server preloaded this module (so torch, shmcoll and the Numba
  kernels are already loaded: a rank starts in milliseconds instead of ~3 s of
  CPU, which is what makes dozens of kill trials affordable on two cores). The
  forkserver reaps its children at once (SIGCHLD), like torchrun's agent.
* ``python -m tests.faults SCENARIO SPEC_JSON``: a fresh interpreter, for
  torchrun jobs and for the case where the test controls reaping itself.

``spec`` holds: rank, world, store ("tcp:HOST:PORT" = a TCPStore hosted by the
test, like torchrun's agent store; "env" = env:// from the environment, rank 0
hosts the store), dir (job folder for reports and markers), env (variables to
set first), args (keyword arguments of the scenario).

Markers: ``Rank.mark(name)`` writes ``dir/NAME.RANK`` holding time.time(), so
the test can see how far a rank got (used to classify where a kill landed).
Nothing here changes shmcoll itself; hooks only wrap ``shmcoll._segment``
functions inside the rank that asks for them.
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import shmcoll  # noqa: F401  (registers "shm")
import shmcoll.collectives  # noqa: F401  (what the first shm group would import)
from shmcoll import _segment, kernel_library
from tests import leaks

kernel_library.warm()  # in the forkserver: once, before any fork
torch.set_num_threads(1)

R = dist.ReduceOp


# -- the rank's view ----------------------------------------------------------

class Rank:
    def __init__(self, spec: dict):
        self.spec = spec
        self.rank = int(spec["rank"])
        self.world = int(spec["world"])
        self.dir = spec["dir"]
        self.report: dict = {"rank": self.rank, "pid": os.getpid()}
        self._base_store = None

    # markers and report ------------------------------------------------------

    def mark(self, name: str, **data) -> None:
        path = os.path.join(self.dir, f"{name}.{self.rank}")
        with open(path + ".tmp", "w") as f:
            json.dump({"time": time.time(), **data}, f)
        os.replace(path + ".tmp", path)

    def save(self) -> None:
        path = os.path.join(self.dir, f"rank{self.rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.report, f, default=str)
        os.replace(path + ".tmp", path)

    # process groups ----------------------------------------------------------

    def store(self, timeout: timedelta):
        """Client of the test's store; like env:// does, its timeout is the group's."""
        kind = self.spec["store"]
        if self._base_store is None and kind.startswith("tcp:"):
            _, host, port = kind.split(":")
            self._base_store = dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
        self._base_store.set_timeout(timeout)
        return self._base_store

    def init(self, timeout: float = 60, backend: str = "shm", prefix: str | None = None) -> None:
        td = timedelta(seconds=timeout)
        if self.spec["store"] == "env":
            dist.init_process_group(backend, init_method="env://", timeout=td)
            return
        store = self.store(td)
        if prefix:
            store = dist.PrefixStore(prefix, store)
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world, timeout=td)

    # hooks -------------------------------------------------------------------

    def hook_segment(self, name: str, before=None, after=None) -> None:
        """Wrap ``shmcoll._segment.NAME`` in this process (arena.py calls it through the module).

        A name ending in '*' wraps every function of that prefix ('create*': however the
        arena creates its segment, named or not).
        """
        names = [n for n in dir(_segment) if n.startswith(name[:-1]) and callable(getattr(_segment, n))] \
            if name.endswith("*") else [name]
        for each in names:
            original = getattr(_segment, each)
            if isinstance(original, type):
                continue

            def wrapper(*args, _original=original, **kwargs):
                if before:
                    before(*args)
                result = _original(*args, **kwargs)
                if after:
                    after(*args)
                return result

            setattr(_segment, each, wrapper)

    def track_segment_phases(self) -> None:
        """Markers 'creating', 'created' and 'unlinked' around the arena's segment lifecycle."""
        self.hook_segment("create*", before=lambda *a: self.mark("creating", path=a[0]),
                          after=lambda *a: self.mark("created", path=a[0]))
        self.hook_segment("unlink_path", after=lambda path: self.mark("unlinked", path=path))


def error_record(error: BaseException, start: float | None = None) -> dict:
    record = {"type": type(error).__name__, "mro": [c.__name__ for c in type(error).__mro__],
              "message": str(error), "time": time.time()}
    if start is not None:
        record["elapsed"] = time.monotonic() - start
    return record


def _suicide(rank: Rank, sig=signal.SIGKILL) -> None:
    rank.mark("killed")
    os.kill(os.getpid(), sig)
    time.sleep(60)  # not reached for SIGKILL


# -- entry points -------------------------------------------------------------

def _run(scenario: str, spec: dict) -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for stacks before killing a hung rank
    os.environ.update({k: str(v) for k, v in spec.get("env", {}).items()})
    rank = Rank(spec)
    rank.mark("start", pid=os.getpid())
    code = 0
    try:
        extra = SCENARIOS[scenario](rank, **spec.get("args", {}))
        if extra:
            rank.report.update(extra)
    except BaseException as error:  # report, then exit non-zero
        rank.report["uncaught"] = error_record(error)
        rank.report["traceback"] = traceback.format_exc()
        code = 3
    rank.save()
    rank.mark("exit", code=code)
    return code


def forked(scenario: str, spec: dict) -> None:
    """multiprocessing target (forkserver child): log to the job folder, run, exit with the code."""
    log = os.open(os.path.join(spec["dir"], f"rank{spec['rank']}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.exit(_run(scenario, spec))


def main() -> int:
    scenario, spec_text = sys.argv[1], sys.argv[2]
    spec = json.loads(spec_text)
    spec.setdefault("rank", os.environ.get("RANK", 0))
    spec.setdefault("world", os.environ.get("WORLD_SIZE", 1))
    return _run(scenario, spec)


# -- 1. dead peer -------------------------------------------------------------

def dead_peer(rank: Rank, victim: int, kill_at: int, numel: int, timeout: float = 60, gather: bool = False,
              stream: bool = False):
    """all_reduce (``gather``: all_gather_into_tensor; ``stream``: the victim sends a message to every other
    rank, which receives it) in a loop; ``victim`` SIGKILLs itself at iteration ``kill_at`` (``gather``,
    ``stream``: from another thread, at whatever point the loop has reached, most likely while its peers read
    its buffer); survivors time the error. (In a stream every survivor's one peer is the victim: in a ring a
    survivor may first wait for another survivor that has raised and exited, and rightly name that one.)"""
    rank.init(timeout=timeout)
    world = rank.world
    t = torch.empty(numel, dtype=torch.float32)
    whole = torch.empty(world * numel, dtype=torch.float32)
    expected = float(sum(range(1, world + 1)))
    wrong = 0
    i = 0
    start = None

    def die():
        with open(os.path.join(rank.dir, "kill_time"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)

    try:
        while True:
            if rank.rank == victim and i == kill_at:
                if not (gather or stream):
                    die()
                threading.Timer(0.003, die).start()
            t.fill_(rank.rank + 1)
            start = time.monotonic()
            if gather:
                dist.all_gather_into_tensor(whole, t)
                wrong += any(whole[r * numel].item() != r + 1 for r in range(world))
            elif stream:
                if rank.rank == victim:
                    works = [dist.isend(t, r) for r in range(world) if r != victim]
                else:
                    works = [dist.irecv(whole[:numel], victim)]
                for work in works:
                    work.wait()
                if rank.rank != victim:
                    wrong += whole[0].item() != victim + 1 or whole[numel - 1].item() != victim + 1
            else:
                dist.all_reduce(t)
                if t[0].item() != expected or t[-1].item() != expected:
                    wrong += 1
            i += 1
            if i > kill_at + 100_000:
                raise AssertionError("the victim never died?")
    except Exception as error:
        rank.report["error"] = error_record(error, start)
        rank.report["iteration"] = i
    rank.report["wrong_results"] = wrong
    rank.save()
    t0 = time.monotonic()
    dist.destroy_process_group()
    rank.report["destroy_s"] = time.monotonic() - t0


# -- 2. timeout ---------------------------------------------------------------

def _call(kind: str, numel: int, dtype=torch.float32, root: int = 0, op=R.SUM, group=None, async_op=False):
    """One collective of ``kind`` on ``numel`` elements; returns the tensors it filled."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if kind == "all_reduce":
        t = torch.full((numel,), rank + 1, dtype=dtype)
        work = dist.all_reduce(t, op=op, group=group, async_op=async_op)
        out = [t]
    elif kind == "broadcast":
        t = torch.full((numel,), rank + 1, dtype=dtype)
        src = dist.get_global_rank(group, root) if group is not None else root
        work = dist.broadcast(t, src=src, group=group, async_op=async_op)
        out = [t]
    elif kind == "all_gather":
        out = [torch.zeros(numel, dtype=dtype) for _ in range(world)]
        work = dist.all_gather(out, torch.full((numel,), rank + 1, dtype=dtype), group=group, async_op=async_op)
    elif kind == "all_gather_into_tensor":
        o = torch.zeros(numel * world, dtype=dtype)
        work = dist.all_gather_into_tensor(o, torch.full((numel,), rank + 1, dtype=dtype), group=group,
                                           async_op=async_op)
        out = [o]
    elif kind == "barrier":
        work = dist.barrier(group=group, async_op=async_op)
        out = []
    else:
        raise ValueError(kind)
    if async_op:
        work.wait()
    return out


def missing_rank(rank: Rank, kind: str, missing: int, timeout: float, numel: int = 1000, warmup: int = 5,
                 root: int = 0):
    """Everyone runs ``warmup`` all_reduces, then ``missing`` sleeps while the others call ``kind``."""
    rank.init(timeout=timeout)
    for _ in range(warmup):
        dist.all_reduce(torch.ones(8))
    rank.report["sequence"] = warmup + 1
    _miss_or_call(rank, missing, timeout + 2.5, lambda: _call(kind, numel, root=root))


def _miss_or_call(rank: Rank, missing: int, stay_s: float, call) -> None:
    """Rank ``missing`` stays alive (a dead rank would be reported as dead, not late) until the others
    reported, or ``stay_s``; the others ``call()`` and report how it ended. Then all leave."""
    if rank.rank == missing:
        deadline = time.monotonic() + stay_s
        others = [os.path.join(rank.dir, f"rank{r}.json") for r in range(rank.world) if r != missing]
        while time.monotonic() < deadline and not all(os.path.exists(p) for p in others):
            time.sleep(0.05)
    else:
        start = time.monotonic()
        try:
            call()
            rank.report["returned_after"] = time.monotonic() - start
        except Exception as error:
            rank.report["error"] = error_record(error, start)
    rank.save()
    dist.destroy_process_group()


def ddp_missing_rank(rank: Rank, sparse: bool, missing: int, timeout: float):
    """DDP trains two steps with everyone (the second rebuilds its buckets, with a broadcast in the
    forward), then ``missing`` skips a step: the others' gradient all-reduce times out, and their
    backward() must raise that error (DDP reads the all-reduce's future from C++; a future completed
    with the exception as its value made it crash)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank.init(timeout=timeout)
    model = DDP(torch.nn.EmbeddingBag(100, 4, sparse=sparse))
    ids, offsets = torch.arange(8) * (rank.rank + 1), torch.tensor([0, 4])
    for _ in range(2):
        model(ids, offsets).sum().backward()
    _miss_or_call(rank, missing, timeout + 5, lambda: model(ids, offsets).sum().backward())


def window_consumer_fails(rank: Rank, failing: int, timeout: float):
    """An all-gather whose windows a consumer reads in shared memory (what the sparse all_reduce's merge
    does), and the consumer of rank ``failing`` raises at the second window: an error of that rank alone,
    so it must give up on the arena at once, and the others raise within a slice or two instead of at
    the timeout."""
    from shmcoll import descriptors

    rank.init(timeout=timeout)
    placement = dist.group.WORLD.placement
    data = torch.full((3 * 4096,), rank.rank, dtype=torch.uint8)  # three windows of 4 KiB chunks

    def consume(start, n, addresses):
        if rank.rank == failing and start > 0:
            raise ValueError("the consumer failed")

    start = time.monotonic()
    try:
        placement.allgather_windows(data, 64, consume, descriptors.descriptor(descriptors.ALLGATHER, data.numel(), 0))
        rank.report["returned_after"] = time.monotonic() - start
    except Exception as error:
        rank.report["error"] = error_record(error, start)
    if rank.rank == failing:  # alive (a dead rank is caught another way) until the others reported
        _miss_or_call(rank, failing, 10, None)
    else:
        rank.save()
        dist.destroy_process_group()


def late_after_timeout(rank: Rank, late: int, timeout: float, numel: int):
    """Rank ``late`` reaches an all_reduce after the others timed out in it and gave up, then calls another:
    it must learn that they gave up (within a slice or two), not wait out the timeout for them."""
    rank.init(timeout=timeout)
    dist.all_reduce(torch.ones(8))
    if rank.rank == late:
        time.sleep(timeout + 1.5)
    start = time.monotonic()
    try:
        for _ in range(2):  # the late one's first may find every input there already, and end
            dist.all_reduce(torch.ones(numel))
        rank.report["returned_after"] = time.monotonic() - start
    except Exception as error:
        rank.report["error"] = error_record(error, start)
    rank.save()
    time.sleep(timeout + 1.5 if rank.rank != late else 0)  # alive: a dead peer would be found another way
    dist.destroy_process_group()


def destroy_beside_unmatched(rank: Rank, lonely: int, timeout: float):
    """Rank ``lonely`` issues an asynchronous all_reduce that no peer issues, and everyone destroys the group
    at once: the peers' destroy returns, so the lonely rank's wait must learn that they closed the group,
    not wait out the timeout, and its Work fail saying so."""
    rank.init(timeout=timeout)
    dist.barrier()
    work = dist.all_reduce(torch.ones(1000), async_op=True) if rank.rank == lonely else None
    start = time.monotonic()
    dist.destroy_process_group()
    rank.report["destroyed_after"] = time.monotonic() - start
    if work is not None:
        try:
            work.wait()
        except Exception as error:
            rank.report["error"] = error_record(error, start)
    rank.save()
    if rank.rank != lonely:
        time.sleep(timeout + 1)  # alive, having left the group: not a dead peer


# -- 3. leaks -----------------------------------------------------------------

def churn(rank: Rank, iters: int = 20, timeout: float = 3, numels=(2, 70_000), victim: int | None = None,
          kill_after: float | None = None, anchor: str = "start"):
    """A short job: init, ``iters`` collectives, destroy. Markers tell where a kill landed.

    ``kill_after``: SIGKILL rank ``victim`` that many seconds after ``anchor``: its
    start, or the moment it starts creating the arena's segment ('creating'). A
    timer thread fires it (the test's own polling would be too coarse to land
    inside a sub-millisecond window; a 0.1 ms GIL switch interval lets the
    timer fire even while the main thread runs Python code).
    """
    def arm(*_):
        sys.setswitchinterval(1e-4)
        timer = threading.Timer(kill_after, os.kill, (os.getpid(), signal.SIGKILL))
        timer.daemon = True
        timer.start()

    armed = kill_after is not None and rank.rank == victim
    if armed and anchor == "start":
        arm()
    rank.track_segment_phases()
    if armed and anchor == "creating":
        rank.hook_segment("create*", before=arm)
    rank.mark("init")
    rank.init(timeout=timeout)
    rank.mark("ready")
    for i in range(iters):
        t = torch.ones(numels[i % len(numels)])
        dist.all_reduce(t)
    dist.barrier()
    rank.mark("destroy")
    dist.destroy_process_group()


def targeted_kill(rank: Rank, who: int, point: str, sig: int = int(signal.SIGKILL), timeout: float = 3):
    """``who`` gets signal ``sig`` at a precise point of init_process_group.

    after_create: right after the segment file was created (name not yet published);
    while_waiting: when the creator waits for the others to map it (its peers were made slow to attach).
    """
    rank.track_segment_phases()
    if rank.rank == who and point == "after_create":
        rank.hook_segment("create*", after=lambda *a: _suicide(rank, sig))
    if point == "while_waiting":
        if rank.rank != 0:
            rank.hook_segment("attach", before=lambda *a: time.sleep(1.5))
        elif rank.rank == who:
            rank.hook_segment("create*", after=lambda *a: _delayed_signal(rank, 0.5, sig))
    rank.mark("init")
    rank.init(timeout=timeout)
    rank.mark("ready")
    dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()


def _delayed_signal(rank: Rank, delay: float, sig: int) -> None:
    def fire():
        rank.mark("killed")
        os.kill(os.getpid(), sig)

    timer = threading.Timer(delay, fire)
    timer.daemon = True
    timer.start()


def normal_exit(rank: Rank):
    rank.init(timeout=10)
    t = torch.ones(1000)
    dist.all_reduce(t)
    assert t[0].item() == rank.world
    dist.destroy_process_group()


def user_exception(rank: Rank):
    rank.init(timeout=10)
    dist.all_reduce(torch.ones(1000))
    raise RuntimeError("user code failed (on purpose)")


def torchrun_rank(rank: Rank, slow_attach: float = 0.0):
    """Under torchrun: init, then all_reduce until interrupted. Optionally slow down attaching."""
    rank.track_segment_phases()
    if slow_attach and rank.rank != 0:
        rank.hook_segment("attach", before=lambda *a: time.sleep(slow_attach))
    rank.mark("init")
    rank.init(timeout=60)
    rank.mark("ready")
    t = torch.ones(1000)
    while True:
        dist.all_reduce(t)
        t.fill_(1)
        time.sleep(0.001)


# -- 4. mismatched collectives -------------------------------------------------

def _fill(kind: str, numel: int, dtype, rank: int, world: int):
    """The tensors a call of ``kind`` uses on ``rank``: (input, outputs); every rank contributes rank + 1."""
    def full(value):
        return torch.full((numel,), value, dtype=dtype) if dtype != torch.bool else torch.ones(numel, dtype=dtype)

    if kind in ("all_reduce", "broadcast"):
        t = full(rank + 1)
        return t, [t]
    if kind == "all_gather":
        return full(rank + 1), [torch.zeros(numel, dtype=dtype) for _ in range(world)]
    if kind == "all_gather_into_tensor":
        return full(rank + 1), [torch.zeros(numel * world, dtype=dtype)]
    return None, []


def _expected(spec: dict, rank: int, world: int):
    """What ``spec``'s outputs hold if every rank had made the same call as this one."""
    kind, numel = spec["kind"], spec.get("numel", 0)
    dtype = getattr(torch, spec.get("dtype", "float32"))
    if kind == "all_reduce":
        values = [r + 1 for r in range(world)]
        op = spec.get("op", "SUM")
        value = {"SUM": sum(values), "MAX": max(values), "MIN": min(values)}[op]
        return [torch.full((numel,), value, dtype=dtype)]
    if kind == "broadcast":
        return [torch.full((numel,), spec.get("root", 0) + 1, dtype=dtype)]
    if kind == "all_gather":
        return [torch.full((numel,), r + 1, dtype=dtype) for r in range(world)]
    if kind == "all_gather_into_tensor":
        return [torch.cat([torch.full((numel,), r + 1, dtype=dtype) for r in range(world)])]
    return []


def _issue(spec: dict, group, inp, outs):
    """The call of ``spec``; with ``async``, issued with async_op=True, and the error expected from its wait()
    (the call itself must not raise it)."""
    kind, asynchronous = spec["kind"], spec.get("async", False)
    if kind == "all_reduce":
        work = dist.all_reduce(outs[0], op=getattr(R, spec.get("op", "SUM")), group=group, async_op=asynchronous)
    elif kind == "broadcast":
        work = dist.broadcast(outs[0], src=dist.get_global_rank(group, spec.get("root", 0)), group=group,
                              async_op=asynchronous)
    elif kind == "all_gather":
        work = dist.all_gather(outs, inp, group=group, async_op=asynchronous)
    elif kind == "all_gather_into_tensor":
        work = dist.all_gather_into_tensor(outs[0], inp, group=group, async_op=asynchronous)
    elif kind == "barrier":
        work = dist.barrier(group=group, async_op=asynchronous)
    else:
        raise ValueError(kind)
    if asynchronous:
        try:
            work.wait()
        except Exception as error:
            error.raised_by_wait = True  # where the caller meets it (mismatch() records it)
            raise


def mismatch(rank: Rank, cases: dict, timeout: float = 2.0):
    """One fresh shm group per case (default group: gloo); each rank makes its own call of the case.

    ``cases``: name -> list (one per rank) of call specs {kind, numel, dtype, root, op}.
    Records per case: the error (or none), the time the call took, and whether the
    rank's tensors are intact (after an error) or right (after a return).
    """
    rank.init(timeout=60, backend="gloo")
    world = rank.world
    results = rank.report["cases"] = {}
    for name, calls in cases.items():
        group = dist.new_group(backend="shm", timeout=timedelta(seconds=timeout))
        spec = calls[rank.rank]
        dtype = getattr(torch, spec.get("dtype", "float32"))
        inp, outs = _fill(spec["kind"], spec.get("numel", 0), dtype, rank.rank, world)
        if any(c.get("warm") for c in calls):
            # Every rank makes each (kind, dtype, op, root) of the case's calls once, alike: the case's own call
            # then meets a plan admitted before, the fast paths' (the compiled small collectives' on one node).
            for kind, dtype_name, op, root in sorted({(c["kind"], c["dtype"], c["op"], c["root"]) for c in calls}):
                one = torch.ones(1, dtype=getattr(torch, dtype_name))
                if kind == "all_reduce":
                    dist.all_reduce(one, op=getattr(R, op), group=group)
                elif kind == "broadcast":
                    dist.broadcast(one, src=dist.get_global_rank(group, root), group=group)
                elif kind == "all_gather_into_tensor":
                    dist.all_gather_into_tensor(one.repeat(world), one, group=group)
        before = [o.clone() for o in outs]
        record = results[name] = {"call": spec}
        start = time.monotonic()
        try:
            _issue(spec, group, inp, outs)
            record["elapsed"] = time.monotonic() - start
            want = _expected(spec, rank.rank, world)
            record["outputs_right"] = all(torch.equal(o, w) for o, w in zip(outs, want))
        except Exception as error:
            record["error"] = error_record(error, start)
            record["error"]["by_wait"] = getattr(error, "raised_by_wait", False)
            record["outputs_intact"] = all(torch.equal(o, b) for o, b in zip(outs, before))
        if not all(torch.equal(o, b) for o, b in zip(outs, before)) and "error" not in record \
                and not record.get("outputs_right"):
            record["first_values"] = [o.reshape(-1)[:4].tolist() for o in outs]
        rank.save()
        dist.barrier()  # gloo: line up before the next case
        dist.destroy_process_group(group)
    # The machinery still works after all that.
    group = dist.new_group(backend="shm", timeout=timedelta(seconds=timeout))
    t = torch.ones(10)
    dist.all_reduce(t, group=group)
    rank.report["after_all"] = t.tolist()
    dist.destroy_process_group()


# -- 5. bad input -------------------------------------------------------------

def _bad_calls(world: int):
    f32 = torch.float32
    return {
        "meta_tensor": lambda: dist.all_reduce(torch.ones(4, device="meta")),
        "cuda_tensor": lambda: dist.all_reduce(torch.ones(4, device="cuda")),
        "sparse_csr_tensor": lambda: dist.all_reduce(torch.ones(2, 2).to_sparse_csr()),
        "sparse_max": lambda: dist.all_reduce(torch.ones(4).to_sparse(), op=R.MAX),
        "non_tensor": lambda: dist.all_reduce([1.0, 2.0]),
        "all_gather_short_list": lambda: dist.all_gather([torch.zeros(4) for _ in range(world - 1)], torch.ones(4)),
        "all_gather_long_list": lambda: dist.all_gather([torch.zeros(4) for _ in range(world + 1)], torch.ones(4)),
        "all_gather_wrong_size": lambda: dist.all_gather([torch.zeros(5) for _ in range(world)], torch.ones(4)),
        "all_gather_into_tensor_wrong_size":
            lambda: dist.all_gather_into_tensor(torch.zeros(4 * world + 3), torch.ones(4)),
        "all_gather_into_tensor_wrong_dtype":
            lambda: dist.all_gather_into_tensor(torch.zeros(4 * world, dtype=torch.float64), torch.ones(4, dtype=f32)),
        "reduce_scatter_tensor_wrong_size":
            lambda: dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * world + 3)),
        "reduce_scatter_tensor_wrong_dtype":
            lambda: dist.reduce_scatter_tensor(torch.zeros(4, dtype=torch.float64), torch.ones(4 * world, dtype=f32)),
        "all_gather_into_tensor_meta_output":
            lambda: dist.all_gather_into_tensor(torch.zeros(4 * world, device="meta"), torch.ones(4)),
        "broadcast_root_too_big": lambda: dist.broadcast(torch.ones(4), src=world),
        "broadcast_root_negative": lambda: dist.broadcast(torch.ones(4), src=-1),
        "band_on_float": lambda: dist.all_reduce(torch.ones(4), op=R.BAND),
        "avg_on_bool": lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=R.AVG),
        "min_on_complex": lambda: dist.all_reduce(torch.ones(4, dtype=torch.complex64), op=R.MIN),
        "unsupported_dtype_uint32": lambda: dist.all_reduce(torch.ones(4, dtype=torch.uint32)),
    }


def bad_input(rank: Rank, backend: str = "shm", timeout: float = 10.0, asym_timeout: float = 2.0):
    """Every rank makes the same bad call; then a good all_reduce must still work on the same group."""
    rank.init(timeout=timeout, backend=backend)
    # Good float32 calls first: later calls of the same kind and dtype try the fast paths
    # (shmcoll.collectives), which must hand every bad one to the general checks.
    world = rank.world
    dist.all_gather_into_tensor(torch.zeros(4 * world), torch.ones(4))
    dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * world))
    dist.broadcast(torch.ones(4), src=0)
    dist.all_reduce(torch.ones(4))
    results = rank.report["cases"] = {}
    for name, call in _bad_calls(world).items():
        record = results[name] = {}
        start = time.monotonic()
        try:
            call()
            record["returned_after"] = time.monotonic() - start
        except Exception as error:
            record["error"] = error_record(error, start)
        t = torch.ones(16)
        try:
            dist.all_reduce(t)
            record["group_still_works"] = bool((t == rank.world).all())
        except Exception as error:
            record["group_still_works"] = False
            record["after_error"] = error_record(error)
        rank.save()
    if backend == "shm":
        # Only rank 1 errs; the others make the right call and must not hang.
        group = dist.new_group(backend="shm", timeout=timedelta(seconds=asym_timeout))
        record = rank.report["asymmetric"] = {}
        start = time.monotonic()
        try:
            n = rank.world - 1 if rank.rank == 1 else rank.world
            dist.all_gather([torch.zeros(4) for _ in range(n)], torch.ones(4), group=group)
            record["returned_after"] = time.monotonic() - start
        except Exception as error:
            record["error"] = error_record(error, start)
        rank.save()
        if rank.rank == 1:
            time.sleep(asym_timeout + 1.5)  # stay alive: the others must time out, naming rank 1
    dist.destroy_process_group()


# -- 6. teardown --------------------------------------------------------------

def _process_state(shm_dir: str) -> dict:
    held = leaks.references(shm_dir)
    tasks = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    return {"os_threads": len(tasks), "os_thread_names": tasks,
            "py_threads": sorted(t.name for t in threading.enumerate()),
            "maps": [line for line in held if line.startswith("map ")],
            "fds": [line for line in held if line.startswith("fd ")], "shm_entries": sorted(os.listdir(shm_dir))}


def reinit(rank: Rank, cycles: int = 3):
    shm_dir = os.environ.get("SHMCOLL_SHM_DIR", "/dev/shm")
    rank.report["before"] = _process_state(shm_dir)
    states = rank.report["cycles"] = []
    for cycle in range(cycles):
        rank.init(timeout=20, prefix=f"cycle{cycle}")
        during = _process_state(shm_dir)
        t = torch.ones(100_000)
        dist.all_reduce(t, async_op=True).wait()  # starts the progress thread, if there is one
        dist.all_reduce(t)
        ok = bool((t == rank.world ** 2).all())
        b = torch.full((10,), float(rank.rank))
        dist.broadcast(b, src=rank.world - 1)
        ok = ok and bool((b == rank.world - 1).all())
        if hasattr(dist, "isend"):  # point-to-point, which may run on a thread of its own
            p = torch.full((1000,), float(rank.rank))
            peer = (rank.rank + 1) % rank.world
            src = (rank.rank - 1) % rank.world
            got = torch.empty(1000)
            reqs = [dist.irecv(got, src), dist.isend(p, peer)]
            for req in reqs:
                req.wait()
            ok = ok and bool((got == src).all())
        dist.barrier()
        threads_in_use = sorted(t.name for t in threading.enumerate())
        dist.destroy_process_group()
        time.sleep(0.1)
        states.append({"ok": ok, "during": during, "threads_in_use": threads_in_use,
                       "after": _process_state(shm_dir)})
        rank.save()


# -- 7. small /dev/shm ----------------------------------------------------------

def small_shm(rank: Rank, timeout: float = 60):
    start = time.monotonic()
    try:
        rank.init(timeout=timeout)
        rank.report["initialised_after"] = time.monotonic() - start
        dist.destroy_process_group()
    except Exception as error:
        rank.report["error"] = error_record(error, start)


SCENARIOS = {fn.__name__: fn for fn in (dead_peer, missing_rank, ddp_missing_rank, window_consumer_fails,
                                        late_after_timeout, destroy_beside_unmatched, churn, targeted_kill,
                                        normal_exit, user_exception, torchrun_rank, mismatch, bad_input, reinit,
                                        small_shm)}

if __name__ == "__main__":
    sys.exit(main())
