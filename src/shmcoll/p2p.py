"""Point-to-point messages through the arena's channels.

Each ordered pair of local ranks owns a channel (see arena.py): the sender
publishes chunk c in half c % 2 and bumps its sequence word; the receiver
copies it out and bumps the acknowledgement word. Chunk c may be written once
chunk c - 2 has been acknowledged, so big messages stream through two halves.
Every half starts with a header (tag, message bytes, offset, chunk bytes)
that the receiver checks against what it expects.

Messages between two ranks arrive in the order they were sent; a tag is
checked, not used to reorder (a receive that finds another tag first raises).

Single copy (``direct_from``: the least message that uses it, None for never):
the sender's one chunk is a header that gives its buffer's address instead of
data; the receiver reads the whole message from the sender's memory
(``process_vm_readv``) and acknowledges the chunk, which ends the send. The
sender decides by the size; the receiver follows the header. Only messages
larger than the two halves: a sender waits for its receiver then, on either
path.

Transfers are non-blocking state machines: ``advance()`` moves data as far as
the channel allows and returns. A send or receive that can finish at once runs
inline; the rest progress together on the group's p2p thread, so isend/irecv
pairs in any order never deadlock.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from shmcoll import _single_copy, _sync, single_copy
from shmcoll._copy import copy
from shmcoll.errors import ShmcollError
from shmcoll.waits import STEP_MASK, reached
from shmcoll.work import AsyncWork, CompletedWork

HEADER_BYTES = 64
DIRECT = -1  # a header's chunk bytes when the chunk carries the sender's address, not data


class _Transfer:
    """State shared by sends and receives: where the bytes are and how far they got."""

    def __init__(self, p2p, peer, addr: int, nbytes: int, tag: int, result):
        self.p2p = p2p
        self.peer = peer  # local rank, or None for a receive from any source
        self.addr = addr
        self.nbytes = nbytes
        self.tag = tag
        self.offset = 0
        self.done = False
        self.result = result
        self.last_progress = time.monotonic()
        self.warn_after = None  # idle seconds after which the next stall warning is due

    def _passed(self, chunks: list, lines: int, line: int, chunk: int, n: int) -> None:
        """Chunk ``chunk`` (``n`` bytes) went through: count it in ``chunks`` and post it on our ``line``
        of the channel, so the other side may go on."""
        chunks[self.peer] = chunk + 1
        _sync.post(lines, line, (chunk + 1) & STEP_MASK, 0)
        self.offset += n
        self.done = self.offset >= self.nbytes


class Send(_Transfer):
    kind = "send"

    def __init__(self, p2p, peer, addr: int, nbytes: int, tag: int, result):
        super().__init__(p2p, peer, addr, nbytes, tag, result)
        # Never a message that fits the channel's two halves: those the copy path sends without waiting for
        # the receiver, and a sender may rely on that (a message nobody receives yet, then a collective).
        self.direct = p2p.direct_from is not None and 2 * p2p.payload < nbytes and p2p.direct_from <= nbytes
        self.read_by = None  # a direct send: the acknowledgement that says the receiver has read our buffer

    def key(self):
        return ("send", self.peer)

    def describe(self) -> str:
        return f"send of {self.nbytes} bytes (tag {self.tag}) to rank {self.p2p.ranks[self.peer]}"

    def advance(self) -> bool:
        p2p, peer = self.p2p, self.peer
        lines, data = p2p.arena.channel(p2p.me, peer)
        if self.read_by is not None:
            self.done = reached(_sync.load_step(lines, 1), self.read_by)
            return self.done
        moved = False
        while not self.done:
            chunk = p2p.sent[peer]
            if not reached(_sync.load_step(lines, 1), chunk - 1):
                break  # the half still holds chunk - 2, not yet read
            half = data + (chunk & 1) * p2p.half_bytes
            if self.direct:
                p2p.write_header(half, self.tag, self.nbytes, 0, DIRECT, self.addr)
                self._passed(p2p.sent, lines, 0, chunk, 0)  # not done: the receiver reads it all
                self.read_by = chunk + 1
                return True
            n = min(p2p.payload, self.nbytes - self.offset)
            p2p.write_header(half, self.tag, self.nbytes, self.offset, n)
            copy(half + HEADER_BYTES, self.addr + self.offset, n)
            self._passed(p2p.sent, lines, 0, chunk, n)
            moved = True
        return moved

    def wait_target(self):
        lines, _ = self.p2p.arena.channel(self.p2p.me, self.peer)
        if self.read_by is not None:
            return lines, 1, self.read_by & STEP_MASK
        return lines, 1, (self.p2p.sent[self.peer] - 1) & STEP_MASK


class Recv(_Transfer):
    kind = "recv"

    def key(self):
        return ("recv", self.peer)

    def describe(self) -> str:
        source = "any rank" if self.peer is None else f"rank {self.p2p.ranks[self.peer]}"
        return f"receive of {self.nbytes} bytes (tag {self.tag}) from {source}"

    def _ready(self, peer) -> bool:
        lines, _ = self.p2p.arena.channel(peer, self.p2p.me)
        return reached(_sync.load_step(lines, 0), self.p2p.received[peer] + 1)

    def advance(self) -> bool:
        p2p = self.p2p
        if self.peer is None:  # any source: the first peer with a message waiting
            for peer in range(p2p.size):
                if peer != p2p.me and self._ready(peer):
                    self.peer = peer
                    break
            else:
                return False
        peer = self.peer
        lines, data = p2p.arena.channel(peer, p2p.me)
        moved = False
        while not self.done and self._ready(peer):
            chunk = p2p.received[peer]
            half = data + (chunk & 1) * p2p.half_bytes
            tag, total, offset, n, address = p2p.read_header(half)
            if tag != self.tag or total != self.nbytes or offset != self.offset:
                raise ShmcollError(
                    f"rank {p2p.ranks[p2p.me]} expected a message of {self.nbytes} bytes with tag {self.tag} from "
                    f"rank {p2p.ranks[peer]} but the next one sent has {total} bytes and tag {tag}; messages "
                    f"between two ranks are delivered in the order sent")
            if n == DIRECT:
                self._read(peer, address)
                n = total
            else:
                copy(self.addr + self.offset, half + HEADER_BYTES, n)
            self._passed(p2p.received, lines, 1, chunk, n)
            moved = True
        return moved

    def _read(self, peer: int, address: int) -> None:
        """The whole message from the sender's buffer at ``address`` (a direct send)."""
        p2p = self.p2p
        code = _single_copy.read(p2p.arena.pid(peer), address, self.addr, self.nbytes)
        if code:
            raise single_copy.read_error(p2p.ranks[p2p.me], p2p.ranks[peer],
                                         f"reading the message of rank {p2p.ranks[peer]} from its buffer", code)

    def wait_target(self):
        if self.peer is None:
            return None
        lines, _ = self.p2p.arena.channel(self.peer, self.p2p.me)
        return lines, 0, (self.p2p.received[self.peer] + 1) & STEP_MASK


class PointToPoint:
    """One group's channels on this rank, and the thread that progresses pending transfers."""

    def __init__(self, arena, name: str, direct_from: int | None = None):
        self.arena = arena
        self.direct_from = direct_from  # the least message read from the sender's buffer (None: none)
        self.me = arena.local_rank
        self.size = arena.local_size
        self.ranks = arena.ranks
        self.half_bytes = arena.p2p_bytes // 2
        self.payload = self.half_bytes - HEADER_BYTES
        self.sent = [0] * self.size  # chunks this rank posted on its channel to each peer
        self.received = [0] * self.size  # chunks this rank consumed from each peer
        self._words = np.frombuffer(arena.segment, dtype=np.int64)
        self._base = arena.segment.address
        self._name = name
        self._cv = threading.Condition()
        self._pending: list[tuple[_Transfer, AsyncWork]] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self._watch = arena.watch  # the arena's wait checks: liveness, timeout, abort (shmcoll.waits)

    # -- headers ---------------------------------------------------------------

    def write_header(self, half: int, tag: int, total: int, offset: int, n: int, address: int = 0) -> None:
        """``n``: the chunk's bytes, or DIRECT with the ``address`` of the sender's whole message."""
        i = (half - self._base) // 8
        self._words[i:i + 5] = (tag, total, offset, n, address)

    def read_header(self, half: int):
        i = (half - self._base) // 8
        return (int(x) for x in self._words[i:i + 5])

    # -- issuing ---------------------------------------------------------------

    def start(self, transfer: _Transfer):
        """Finish ``transfer`` inline if it can, else queue it; return its Work."""
        with self._cv:
            if self._closed:
                raise ShmcollError(f"point-to-point engine {self._name} was shut down")
            if not self._pending:
                transfer.advance()
                if transfer.done:
                    return CompletedWork(transfer.result, self._source(transfer))
            work = AsyncWork(transfer.result, transfer.describe())
            self._pending.append((transfer, work))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"shmcoll-p2p-{self._name}", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        return work

    def _source(self, transfer) -> int:
        return self.ranks[transfer.peer] if transfer.kind == "recv" else -1

    # -- progress thread -------------------------------------------------------

    def _advance_all(self) -> bool:
        """One pass over pending transfers, FIFO per channel; True if any moved."""
        moved = False
        blocked: set = set()
        any_recv_blocked = False
        still = []
        for transfer, work in self._pending:
            key = transfer.key()
            is_recv = transfer.kind == "recv"
            if key in blocked or (is_recv and (any_recv_blocked or (transfer.peer is None and
                                                                    any(k[0] == "recv" for k in blocked)))):
                blocked.add(key)
                still.append((transfer, work))
                continue
            try:
                if transfer.advance():
                    moved = True
                    transfer.last_progress = time.monotonic()
                self._check_stalled(transfer)
            except BaseException as error:
                work.finish(error)
                continue
            if transfer.done:
                work.finish(None, self._source(transfer))
            else:
                blocked.add(key)
                any_recv_blocked |= is_recv and transfer.peer is None
                still.append((transfer, work))
        self._pending = still
        return moved

    def _check_stalled(self, transfer) -> None:
        """A transfer that made no progress for a while: the same checks as every wait (``shmcoll.waits``),
        with the time since its last progress as the time waited."""
        self._watch.raise_if_aborted(transfer.describe())
        idle = time.monotonic() - transfer.last_progress
        if idle < 0.5:
            return
        peers = [transfer.peer] if transfer.peer is not None else [p for p in range(self.size) if p != self.me]
        transfer.warn_after = self._watch.check(peers, idle, transfer.describe(),
                                                transfer.warn_after or self._watch.first_warning())

    def _loop(self) -> None:
        idle_passes = 0
        while True:
            with self._cv:
                while not self._pending:
                    if self._closed:
                        return
                    self._cv.wait()
                    idle_passes = 0
                moved = self._advance_all()
                single = self._pending[0][0].wait_target() if len(self._pending) == 1 else None
            if moved:
                idle_passes = 0
            elif single is not None:
                # One transfer waiting on one word: sleep on it (spin, yield, futex), 1 ms at most.
                lines, index, target = single
                _sync.wait_rank(lines, index, target, self.arena.budgets.spin_ns, self.arena.budgets.yield_ns,
                                1_000_000)
            else:
                idle_passes += 1
                time.sleep(0 if idle_passes < 50 else min(1e-3, 1e-5 * idle_passes))

    def close(self) -> None:
        with self._cv:
            self._closed = True
            for _, work in self._pending:
                work.finish(ShmcollError(f"{self._name}: process group shut down with this transfer pending"))
            self._pending = []
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._words = None
