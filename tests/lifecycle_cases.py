"""One rank of a lifecycle case: ``python -m tests.lifecycle_cases CASE`` (under torchrun or tests/test_lifecycle.py).

Each case is what a training job does around its process groups — destroy,
re-init, exit with or without destroy, fail, fork DataLoader workers, abort a
hung collective — on the default backend $LIFECYCLE_BACKEND ("shm" or "gloo",
so that Gloo runs beside shm). A rank checks its results itself (an assert
fails the rank), and last prints which of our threads are still alive:

    LIFECYCLE-THREADS: []

The test reads exit codes, that line, and the job's $SHMCOLL_SHM_DIR.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

BACKEND = os.environ.get("LIFECYCLE_BACKEND", "shm")


def _init(timeout_s: float = 60) -> None:
    dist.init_process_group(BACKEND, timeout=timedelta(seconds=timeout_s))


def _values(rank: int, n: int = 1000) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + 1000 * rank


def _summed(world: int, n: int = 1000) -> torch.Tensor:
    return sum(_values(r, n) for r in range(world))


def _report_threads() -> None:
    ours = [t.name for t in threading.enumerate() if t.name.startswith("shmcoll")]
    print("LIFECYCLE-THREADS: " + json.dumps(ours), flush=True)


def mixed_with_gloo() -> None:
    """The default group plus a Gloo subgroup (for object collectives, as many jobs keep), then destroy and exit."""
    _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    for group in (None, gloo):
        t = _values(rank)
        dist.all_reduce(t, group=group)
        assert torch.equal(t, _summed(world)), group
    outputs = [[torch.zeros(3) for _ in range(2)] for _ in range(world)]
    dist.all_gather_coalesced(outputs, [torch.full((3,), 10.0 * rank), torch.full((3,), 10.0 * rank + 1)],
                              group=gloo)
    assert all(torch.equal(outputs[r][i], torch.full((3,), 10.0 * r + i)) for r in range(world) for i in range(2))
    dist.destroy_process_group()
    _report_threads()


def destroy_one_subgroup() -> None:
    """Destroying one subgroup leaves the default group and another subgroup working."""
    _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    doomed = dist.new_group(backend=BACKEND)
    other = dist.new_group(list(reversed(range(world))), backend=BACKEND)
    for group in (None, doomed, other):
        t = _values(rank)
        dist.all_reduce(t, group=group)
        assert torch.equal(t, _summed(world))
    dist.destroy_process_group(doomed)
    for _ in range(3):
        for group in (None, other):
            t = _values(rank)
            dist.all_reduce(t, group=group)
            assert torch.equal(t, _summed(world))
            dist.barrier(group=group)
    if BACKEND == "shm":  # Gloo has no shutdown on torch 2.13: its destroyed groups keep working
        try:
            dist.all_reduce(_values(rank), group=doomed)
        except (ValueError, RuntimeError):
            pass
        else:
            raise AssertionError("a destroyed group still ran a collective")
    dist.destroy_process_group()
    _report_threads()


def reinit() -> None:
    """init, use, destroy: three rounds in the same processes.

    Each round rendezvous through a FileStore of its own: re-binding env://'s TCPStore port in the next
    round races with the old server (torch's problem, with any backend).
    """
    import tempfile

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    files = os.path.join(tempfile.gettempdir(), f"lifecycle-reinit-{os.environ['MASTER_PORT']}")
    for round_ in range(3):
        dist.init_process_group(BACKEND, init_method=f"file://{files}-{round_}", rank=rank, world_size=world)
        t = _values(rank) * (round_ + 1)
        dist.all_reduce(t)
        assert torch.equal(t, _summed(world) * (round_ + 1)), round_
        dist.destroy_process_group()
    _report_threads()


def exit_without_destroy() -> None:
    """The job ends without destroy_process_group: torch warns, and the exit code stays 0.

    (Only the default group: a Gloo group left undestroyed at exit can abort the
    process by itself, shm or not — see RELIABILITY.md.)
    """
    _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    sub = dist.new_group(backend=BACKEND)
    for group in (None, sub):
        t = _values(rank)
        dist.all_reduce(t, group=group)
        assert torch.equal(t, _summed(world))


def exception_in_user_code() -> None:
    """The last rank raises after a collective; the others are already waiting in the next one."""
    _init(timeout_s=30)
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(_values(rank))
    if rank == world - 1:
        raise RuntimeError("user code failed on purpose")
    dist.all_reduce(_values(rank))  # its peer is gone: must raise within seconds, not at the timeout
    raise AssertionError("an all_reduce completed without the rank that failed")


def busy_until_signalled() -> None:
    """Collectives in a loop until torchrun stops the job (SIGTERM or SIGINT to torchrun)."""
    _init()
    rank = dist.get_rank()
    sys.stdout.write(f"LIFECYCLE-READY {rank}\n")  # one write: the ranks share torchrun's stdout
    sys.stdout.flush()
    big = torch.ones(1 << 20)
    while True:
        dist.all_reduce(big)
        dist.barrier()


class _Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor([float(i * i)])


def forked_dataloader_workers() -> None:
    """DataLoader workers forked after init: they never touch the group, and it keeps working after them."""
    _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    t = _values(rank)
    dist.all_reduce(t)
    assert torch.equal(t, _summed(world))
    for epoch in range(2):
        loader = torch.utils.data.DataLoader(_Squares(), batch_size=8, num_workers=2,
                                             multiprocessing_context="fork")
        total = sum(batch.sum() for batch in loader)
        assert total.item() == sum(i * i for i in range(64)), total
        t = _values(rank) + epoch
        dist.all_reduce(t)  # the workers have exited: the arena must still be mapped and usable here
        assert torch.equal(t, _summed(world) + world * epoch)
    dist.destroy_process_group()
    _report_threads()


def _idle_while_aborted() -> None:
    """A rank that never joins: alive, so only abort() can end its peers' wait early; then a clean exit."""
    time.sleep(4)
    dist.destroy_process_group()
    _report_threads()


def _raises_soon_after_abort(group, call, what: str, words: tuple) -> None:
    """``call()`` waits for a rank that never comes; a thread aborts ``group`` 1 s in: the call must raise within
    about a second of abort(), far inside the group's 60 s timeout, with one of ``words`` in its message."""
    aborted_at = []

    def abort_soon():
        time.sleep(1.0)
        aborted_at.append(time.monotonic())
        group.abort()

    threading.Thread(target=abort_soon).start()
    start = time.monotonic()
    try:
        call()
    except RuntimeError as error:
        raised_after = time.monotonic() - aborted_at[0]
        assert raised_after < 2.0, f"the {what} raised {raised_after:.2f} s after abort()"
        assert any(word in str(error) for word in words), error
    else:
        raise AssertionError(f"the {what} returned after {time.monotonic() - start:.1f} s")


def abort_hung_collective(n: int = 1000) -> None:
    """Rank 0 waits in an all_reduce (of ``n`` elements) that the last rank never joins; another thread aborts
    the group.

    The all_reduce must raise within about a second of abort(); the group then refuses collectives; abort()
    again and shutdown() from another thread are harmless; the exit is clean.
    """
    _init(timeout_s=60)
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.distributed_c10d._get_default_group()
    t = _values(rank, n)
    dist.all_reduce(t)
    assert torch.equal(t, _summed(world, n))
    dist.barrier()
    if rank == world - 1:
        _idle_while_aborted()
        return
    _raises_soon_after_abort(group, lambda: dist.all_reduce(_values(rank, n)), "all_reduce", ("abort",))
    try:
        dist.all_reduce(_values(rank, n))
    except RuntimeError as error:
        assert "abort" in str(error), error
    else:
        raise AssertionError("an aborted group ran a collective")
    group.abort()
    closer = threading.Thread(target=group.shutdown)
    closer.start()
    closer.join()
    dist.destroy_process_group()
    _report_threads()


def abort_hung_collective_over_lanes() -> None:
    """The same with a 4 MiB all_reduce over three lanes, which the compiled front starts in C
    (``_front.SmallCollectives``): abort() must reach every lane's wait, each rank's lanes stopped before it
    raises."""
    os.environ["SHMCOLL_THREADS"] = "3"
    abort_hung_collective(1 << 20)


def abort_hung_recv() -> None:
    """Rank 0 waits in a recv that the last rank never sends; another thread aborts the group. The recv, which
    waits in C on the caller's thread (p2p.PointToPoint.help), must raise within about a second of abort(),
    and the exit is clean."""
    _init(timeout_s=60)
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.distributed_c10d._get_default_group()
    dist.barrier()
    if rank != 0:
        _idle_while_aborted()
        return
    _raises_soon_after_abort(group, lambda: dist.recv(torch.zeros(5), world - 1), "recv", ("abort", "shut down"))
    dist.destroy_process_group()
    _report_threads()


_KEPT = {}


def gloo_worker_busy_at_exit() -> None:
    """A Gloo worker thread that still needs the GIL when the main thread reaches interpreter exit (the
    SIGABRT that gloo_exit prevents, made certain): the future callback of a Gloo all_reduce, which runs on Gloo's
    worker, waits until the main thread has begun its exit, then returns and the worker drops the Work,
    whose tensor the main thread has released. The process must wait for it, not abort."""
    import atexit

    _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = _KEPT["gloo"] = dist.new_group(backend="gloo")  # alive to the end, as a script's global is
    exiting = threading.Event()
    atexit.register(exiting.set)  # registered after init, so it runs before shmcoll's exit hook

    def late(future):
        exiting.wait(30)
        time.sleep(0.005)  # and hold the worker a little into the exit
        return future.value()

    t = _values(rank)
    work = dist.all_reduce(t, group=gloo, async_op=True)
    done = work.get_future().then(late)
    work.get_future().wait()  # done before the callbacks run (Work.wait() would wait for them)
    assert torch.equal(t, _summed(world))
    del t, work, done
    dist.destroy_process_group()
    _report_threads()


CASES = {f.__name__: f for f in (mixed_with_gloo, destroy_one_subgroup, reinit, exit_without_destroy,
                                 exception_in_user_code, busy_until_signalled, forked_dataloader_workers,
                                 abort_hung_collective, abort_hung_collective_over_lanes, abort_hung_recv,
                                 gloo_worker_busy_at_exit)}

if __name__ == "__main__":
    torch.set_num_threads(1)
    CASES[sys.argv[1]]()
