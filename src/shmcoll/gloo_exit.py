"""Keep the interpreter from finalizing while a Gloo worker thread still needs the GIL.

The SIGABRT at exit of jobs that mix shm with Gloo groups ("terminate called
without an active exception", torch issue #190489) is Gloo's: a Gloo worker
thread (``pt_gloo_runloop``) drops its reference to a finished Work only after
it has woken the caller. When the caller has already let go of the Work's
tensors, that drop releases their Python objects, so the worker takes the GIL.
If the interpreter has begun finalizing by then, CPython ends the thread inside
``take_gil`` with ``pthread_exit``, and the forced unwind through the Work's
(noexcept) destructor calls ``std::terminate``. gdb shows exactly that stack
(``runLoop`` -> ``~AsyncWork`` -> ``decref_pyobject`` -> ``take_gil`` ->
``PyThread_exit_thread``) in the aborted ranks.

The window is between the collective's completion and the worker's next turn
on a CPU, which on a loaded machine can outlast all the Python that follows a
job's last Gloo collective. A fixed pause only narrows it (with a 1 ms one,
about one run in 60 of a 3-rank job under load still aborted), so at
interpreter exit, before finalization starts, the main thread releases the GIL
until every Gloo worker of the process is back in its idle wait.

"Idle" is read from ``/proc/self/task/<tid>/syscall``: an idle worker sleeps in
``pthread_cond_wait`` on its work queue, a futex wait (FUTEX_WAIT_BITSET) with
no timeout. A worker that waits for the GIL sleeps in a *timed* futex wait
(CPython's ``take_gil``), one that runs or is runnable reports ``running``, and
one inside a Gloo collective waits with a timeout too; none of those is idle.
Where that cannot be read (another architecture, a /proc we may not read) the
wait is skipped, which is what Gloo-only jobs get from torch.

Gloo groups alone are torch's to fix; this hook is installed only by processes
that made an shm group (the jobs whose exits are ours to answer for).

The workers are known by the name torch's ProcessGroupGloo gives their threads,
which torch may change; ``workers_carry_the_name`` checks it (torch_internals).
"""
from __future__ import annotations

import atexit
import os
import platform
import threading
import time

# How long exit waits for busy Gloo workers at most: a worker needs only a turn on a CPU; one still inside a
# collective that a peer never joins will not finish, and exit must not hang on it.
WAIT_S = 2.0

_GLOO_WORKER = "pt_gloo_runloop"
_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT_BITSET = 9  # the futex command of glibc's pthread_cond_wait
_FUTEX_COMMAND_MASK = 0x7F  # without FUTEX_PRIVATE_FLAG and FUTEX_CLOCK_REALTIME

_installed = threading.Lock()
_hook = None


def install() -> None:
    """Wait for Gloo's workers at this process's exit (once per process, whatever the number of groups)."""
    global _hook
    with _installed:
        if _hook is None and _FUTEX is not None:
            _hook = wait_for_gloo_workers
            atexit.register(_hook)


def wait_for_gloo_workers(timeout_s: float = WAIT_S) -> bool:
    """Release the GIL until every Gloo worker thread of this process is idle; False if ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while not _gloo_workers_idle():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def _gloo_workers_idle() -> bool:
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != _GLOO_WORKER:
                    continue
            with open(f"/proc/self/task/{tid}/syscall") as f:
                call = f.read().split()
        except FileNotFoundError:  # the thread has ended
            continue
        except OSError:  # /proc/<tid>/syscall not readable here: no way to tell, so do not wait
            return True
        if not _idle(call):
            return False
    return True


def _idle(call: list[str]) -> bool:
    """Whether a thread's /proc syscall line is an untimed condition-variable wait: number, then six arguments
    (futex: address, operation, value, timeout, ...); a running thread reads "running"."""
    if len(call) < 5 or not call[0].isdigit() or int(call[0]) != _FUTEX:
        return False
    operation, timeout = int(call[2], 16), int(call[4], 16)
    return operation & _FUTEX_COMMAND_MASK == _FUTEX_WAIT_BITSET and timeout == 0


def workers_carry_the_name() -> str | None:
    """None if a Gloo group's worker threads carry the name this module waits for, else what was found instead.

    It makes a one-rank Gloo group and runs one collective on it, after which its workers have started and
    named themselves: too dear for every process (``python -m shmcoll info`` and the tests run it)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    before = _thread_names()
    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=30))
    try:
        group.allreduce([torch.zeros(1)]).wait()
        if _GLOO_WORKER in _thread_names():
            return None
        found = sorted(set(_thread_names()) - set(before)) or ["no new thread"]
    finally:
        del group
    return f"a Gloo group's threads are named {', '.join(found)}, none {_GLOO_WORKER}"


def _thread_names() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # the thread has ended
            continue
    return names
