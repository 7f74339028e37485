"""Whether the ranks of a node may read each other's memory (single-copy transfers), decided once per group.

Large collectives inside a node can copy each byte once, a rank reading its
peers' buffers with ``process_vm_readv`` (``_ext/single_copy.pyx``), instead
of twice through the arena. The kernel allows it only where one process may
ptrace the other: same user and user namespace, no seccomp filter refusing the
call (some container runtimes), and, with Yama's ``ptrace_scope``:

  0  any process of the same user: nothing to do;
  1  only an ancestor, or a tracer the target names: each rank names the
     launcher that started every rank of its node (torchrun's agent, their
     common parent) with PR_SET_PTRACER, so that its sibling ranks, and nothing
     else of the user's, may read it; ranks without a common parent are refused;
  2, 3  admin only, or never: refused.

Rather than reason about every policy, each rank reads a probe buffer of every
local peer, and the node uses single copy only if every read of every rank
succeeded (through the store: every rank decides alike). Refused, the group
uses the copy path and says why at INFO.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

from shmcoll import _single_copy

_PR_SET_PTRACER = 0x59616D61
_YAMA = "/proc/sys/kernel/yama/ptrace_scope"
_PROBE_BYTES = 64


def yama_scope() -> int | None:
    """Yama's ptrace_scope, or None where Yama is not there."""
    try:
        with open(_YAMA) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def agree(store, key: str, rank: int, local_ranks: list[int], settings) -> str | None:
    """None if every rank of the node can read every other's memory; else why not (the same on every rank).
    Collective over ``local_ranks`` (every rank of the node calls it)."""
    if settings.single_copy == "0":
        return "SHMCOLL_SINGLE_COPY=0"
    scope = yama_scope()
    if scope is not None and scope >= 2:
        return f"Yama's ptrace_scope is {scope} ({_YAMA}): only an administrator's processes may read others"
    me = local_ranks.index(rank)
    probe = np.full(_PROBE_BYTES, me + 1, dtype=np.uint8)
    store.set(f"{key}/{rank}", f"{os.getpid()} {probe.ctypes.data} {os.getppid()}")
    peers = [value.decode().split() for value in store.multi_get([f"{key}/{r}" for r in local_ranks])]
    outcome = "ok"
    if scope == 1:
        parents = {int(parent) for _, _, parent in peers}
        if len(parents) != 1:
            outcome = (f"Yama's ptrace_scope is 1 and the ranks of this node have different parents "
                       f"({', '.join(map(str, sorted(parents)))}), so no common launcher can be named their tracer")
        elif ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PTRACER, ctypes.c_ulong(parents.pop()), 0, 0, 0) != 0:
            outcome = f"prctl(PR_SET_PTRACER) failed: {os.strerror(ctypes.get_errno())}"
        store.set(f"{key}/{rank}/tracer", "1")  # every rank named its tracer before any reads it
        store.wait([f"{key}/{r}/tracer" for r in local_ranks])
    if outcome == "ok":
        outcome = _probe_peers(peers, me)
    store.set(f"{key}/{rank}/outcome", f"rank {rank}: {outcome}" if outcome != "ok" else "ok")
    outcomes = [value.decode() for value in store.multi_get([f"{key}/{r}/outcome" for r in local_ranks])]
    del probe  # every peer is done reading it: it wrote its outcome after its reads
    return next((o for o in outcomes if o != "ok"), None)


def _probe_peers(peers: list[list[str]], me: int) -> str:
    got = np.zeros(_PROBE_BYTES, dtype=np.uint8)
    for peer, (pid, address, _) in enumerate(peers):
        if peer == me:
            continue
        err = _single_copy.probe(int(pid), int(address), got.ctypes.data, _PROBE_BYTES)
        if err:
            return f"process_vm_readv of local rank {peer} (pid {pid}) failed: {os.strerror(err)}"
        if not (got == peer + 1).all():
            return f"process_vm_readv of local rank {peer} (pid {pid}) read other bytes than it holds"
    return "ok"


def self_check() -> str | None:
    """For ``python -m shmcoll info``: None if a child process can read this one's memory, else why not."""
    scope = yama_scope()
    if scope is not None and scope >= 2:
        return f"Yama's ptrace_scope is {scope}"
    probe = np.full(_PROBE_BYTES, 7, dtype=np.uint8)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # read the parent, report the errno through the pipe
        got = np.zeros(_PROBE_BYTES, dtype=np.uint8)
        err = _single_copy.probe(os.getppid(), probe.ctypes.data, got.ctypes.data, _PROBE_BYTES)
        os.write(write, str(err if err else (0 if (got == 7).all() else -1)).encode())
        os._exit(0)
    os.close(write)
    answer = int(os.read(read, 32) or b"-1")
    os.close(read)
    os.waitpid(child, 0)
    if answer == 0:
        return None
    return "a child read other bytes" if answer < 0 else f"process_vm_readv failed: {os.strerror(answer)}"
