"""A rank of another node dies in the middle of a hierarchical collective (tests/test_multinode.py).

The default group is Gloo; the scenario creates an shm group over all ranks with a
short timeout, checks that it works, lines everyone up, and then the victim dies
(SIGKILL): ``before`` the others start ``op`` (it never joins it), or ``during`` a
loop of ``op`` that every rank runs, from a timer of its own, at whatever point of
whichever collective the timer lands in. Each survivor reports its first error, how
long the call that raised took, and what the next collectives on the group raised;
the survivors then wait for each other (through files), so that no error they saw
can come from a survivor exiting.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from tests.multinode import _backend, _layout
from tests.references import assert_equal

GROUP_TIMEOUT_S = 30.0
# ``during``: the victim's timer fires this long into the loop, which runs up to LOOP_S.
DURING_DELAY_S, LOOP_S = 0.2, 10.0
COUNT = 5003  # elements: above SHMCOLL_SMALL_BYTES of tests.multinode.SMALL_CHUNKS, so the rails' plans


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _op(name: str, group, rank: int, world: int):
    """One call of collective ``name`` on ``group`` (a fresh one each time: no two share tensors)."""
    if name == "all_reduce":
        return lambda: dist.all_reduce(torch.ones(COUNT), group=group)
    if name == "barrier":
        return lambda: dist.barrier(group=group)
    if name == "all_gather_into_tensor":
        return lambda: dist.all_gather_into_tensor(torch.empty(world * COUNT), torch.ones(COUNT), group=group)
    if name == "reduce_scatter_tensor":
        return lambda: dist.reduce_scatter_tensor(torch.empty(COUNT), torch.ones(world * COUNT), group=group)
    if name == "broadcast":
        return lambda: dist.broadcast(torch.ones(COUNT), src=world - 1, group=group)
    if name == "all_to_all_single":
        return lambda: dist.all_to_all_single(torch.empty(world * COUNT), torch.ones(world * COUNT), group=group)
    raise ValueError(f"no such collective in this scenario: {name}")


def peer_dies(cases, victim: str, op: str, when: str = "before"):
    rank, world, victim = dist.get_rank(), dist.get_world_size(), int(victim)
    group = dist.new_group(backend="shm", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    t = torch.ones(COUNT)
    dist.all_reduce(t, group=group)
    assert_equal(t, torch.full((COUNT,), float(world)), "all_reduce before the failure")
    layout = _layout(_backend(group))  # after a collective, which started the lanes' threads where it split
    call = _op(op, group, rank, world)
    dist.barrier(group=group)
    if rank == victim:
        if when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            threading.Timer(DURING_DELAY_S, os.kill, (os.getpid(), signal.SIGKILL)).start()

    first, calls = None, 0
    end = time.monotonic() + (LOOP_S if when == "during" else 0)
    while first is None:
        start = time.monotonic()
        try:
            call()
        except Exception as error:
            first = error
        elapsed = time.monotonic() - start
        calls += 1
        if start > end:
            break
    cases.check(f"{op} raised", first is not None, f"{op} returned {calls} times although rank {victim} died")

    def refused(name, call):
        try:
            call()
        except Exception as error:
            text = str(error)
            assert "unusable" in text and str(first) in text, f"{name} raised, but not the unusable error: {text}"
            return
        raise AssertionError(f"{name} returned on a group whose {op} failed")

    if first is not None:
        cases.run("all_reduce refused", refused, "all_reduce", lambda: dist.all_reduce(torch.ones(7), group=group))
        cases.run("empty all_reduce refused", refused, "empty all_reduce",
                  lambda: dist.all_reduce(torch.ones(0), group=group))
        cases.run("all_to_all_single refused (flat Gloo)", refused, "all_to_all_single",
                  lambda: dist.all_to_all_single(torch.empty(world), torch.ones(world), group=group))
        cases.run("send refused (Gloo across nodes)", refused, "send",
                  lambda: dist.send(torch.ones(3), dst=(rank + 1) % world, group=group))

    folder = os.path.dirname(os.environ["SHMCOLL_TEST_REPORT"])
    survivors = [r for r in range(world) if r != victim]
    open(os.path.join(folder, f"done-{rank}"), "w").close()
    deadline = time.monotonic() + 2 * GROUP_TIMEOUT_S
    while time.monotonic() < deadline and not all(os.path.exists(os.path.join(folder, f"done-{r}"))
                                                  for r in survivors):
        time.sleep(0.05)
    return {"layout": layout, "first_error": None if first is None else _error_text(first), "elapsed": elapsed,
            "calls": calls}
