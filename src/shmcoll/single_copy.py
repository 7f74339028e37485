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

Allowed is not the same as faster. The kernel pins every page it reads, and
what that costs depends on the machine: on one 2-core VM a 256 KiB read took
about as long as a copy, on another five times as long (BENCHMARKS.md, "Single
copy"). So the probe also times it: each rank reads its next peer's probe
buffer and copies a buffer of its own, a few times each, and the node keeps
the slowest rank's ratio of the two (``Verdict.read_cost``), from which the
placement decides where single copy pays.
"""
from __future__ import annotations

import ctypes
import errno
import os
import time
from typing import NamedTuple

import numpy as np

from shmcoll import _single_copy
from shmcoll.errors import PeerDiedError, ShmcollError

_PR_SET_PTRACER = 0x59616D61
_YAMA = "/proc/sys/kernel/yama/ptrace_scope"
# What a rank reads of each peer: the size at which the cost of a read against a copy decides the most
# (the movement collectives' spans start at a few KiB; from about 256 KiB their time is the bytes').
PROBE_BYTES = 256 << 10
TIMED_READS = 8  # each timed, the fastest kept: a rank descheduled mid-read must not decide


class Verdict(NamedTuple):
    """What a node's ranks agreed: why single copy is refused (None: allowed), and what a read of a peer
    costs against a copy of the same bytes (the slowest rank's ratio; 0.0 where nothing was measured)."""

    refused: str | None
    read_cost: float = 0.0


def yama_scope() -> int | None:
    """Yama's ptrace_scope, or None where Yama is not there."""
    try:
        with open(_YAMA) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def agree(store, key: str, rank: int, local_ranks: list[int], settings) -> Verdict:
    """Whether every rank of the node can read every other's memory, and at what cost (the same verdict on
    every rank). Collective over ``local_ranks`` (every rank of the node calls it)."""
    if settings.single_copy == "0":
        return Verdict("SHMCOLL_SINGLE_COPY=0")
    scope = yama_scope()
    if scope is not None and scope >= 2:
        return Verdict(f"Yama's ptrace_scope is {scope} ({_YAMA}): only an administrator's processes may read "
                       "others")
    me = local_ranks.index(rank)
    probe = np.full(PROBE_BYTES, me + 1, dtype=np.uint8)
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
    cost = 0.0
    if outcome == "ok":
        outcome = _probe_peers(peers, me)
    if outcome == "ok":
        pid, address, _ = peers[(me + 1) % len(peers)]
        cost = read_cost(int(pid), int(address))
    store.set(f"{key}/{rank}/outcome", f"ok {cost!r}" if outcome == "ok" else f"rank {rank}: {outcome}")
    outcomes = [value.decode() for value in store.multi_get([f"{key}/{r}/outcome" for r in local_ranks])]
    del probe  # every peer is done reading it: it wrote its outcome after its reads
    refused = next((o for o in outcomes if not o.startswith("ok ")), None)
    if refused is not None:
        return Verdict(refused)
    return Verdict(None, max(float(o.split()[1]) for o in outcomes))


def _probe_peers(peers: list[list[str]], me: int) -> str:
    got = np.zeros(PROBE_BYTES, dtype=np.uint8)
    for peer, (pid, address, _) in enumerate(peers):
        if peer == me:
            continue
        err = _single_copy.read(int(pid), int(address), got.ctypes.data, PROBE_BYTES)
        if err:
            return f"process_vm_readv of local rank {peer} (pid {pid}) failed: {os.strerror(err)}"
        if not (got == peer + 1).all():
            return f"process_vm_readv of local rank {peer} (pid {pid}) read other bytes than it holds"
    return "ok"


def read_cost(pid: int, address: int) -> float:
    """How many times longer reading ``PROBE_BYTES`` of process ``pid`` at ``address`` takes than copying as
    many bytes in this process: the fastest of a few of each, interleaved (both on warm pages). The peer's
    buffer must stay readable until this returns; a failed read counts as no gain (infinity)."""
    into = np.ones(PROBE_BYTES, dtype=np.uint8)
    source = np.full(PROBE_BYTES, 2, dtype=np.uint8)
    reads, copies = [], []
    for _ in range(TIMED_READS):
        start = time.perf_counter_ns()
        if _single_copy.read(pid, address, into.ctypes.data, PROBE_BYTES):
            return float("inf")
        reads.append(time.perf_counter_ns() - start)
        start = time.perf_counter_ns()
        np.copyto(into, source)
        copies.append(time.perf_counter_ns() - start)
    return min(reads) / max(1, min(copies))


def self_check() -> Verdict:
    """For ``python -m shmcoll info``: whether a child process can read this one's memory, and at what cost."""
    scope = yama_scope()
    if scope is not None and scope >= 2:
        return Verdict(f"Yama's ptrace_scope is {scope}")
    probe = np.full(PROBE_BYTES, 7, dtype=np.uint8)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # read the parent, report the errno (and the cost) through the pipe
        got = np.zeros(PROBE_BYTES, dtype=np.uint8)
        err = _single_copy.read(os.getppid(), probe.ctypes.data, got.ctypes.data, PROBE_BYTES)
        answer = err if err else (0 if (got == 7).all() else -1)
        cost = read_cost(os.getppid(), probe.ctypes.data) if answer == 0 else 0.0
        os.write(write, f"{answer} {cost!r}".encode())
        os._exit(0)
    os.close(write)
    answer, cost = (os.read(read, 64) or b"-1 0.0").split()
    os.close(read)
    os.waitpid(child, 0)
    if int(answer) == 0:
        return Verdict(None, float(cost))
    return Verdict("a child read other bytes" if int(answer) < 0 else
                   f"process_vm_readv failed: {os.strerror(int(answer))}")


def failed(read: str, code: int) -> str:
    """'<read> failed: ESRCH': a read of a peer's memory (``read``, in words) refused with errno ``code``."""
    return f"{read} failed: {errno.errorcode.get(code, code)}"


def read_error(reader: int, owner: int, read: str, code: int) -> ShmcollError:
    """The error of rank ``reader``'s read of rank ``owner``'s memory refused with errno ``code``, once
    nothing else explains it: the owner exited (ESRCH: PeerDiedError), or its buffer is gone."""
    what = f"rank {reader}: {failed(read, code)}"
    if code == errno.ESRCH:
        return PeerDiedError(f"{what} (rank {owner} exited)")
    return ShmcollError(f"{what} ({os.strerror(code)})")
