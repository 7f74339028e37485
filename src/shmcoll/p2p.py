"""Point-to-point messages through the arena's channels.

Each ordered pair of local ranks owns a channel (arena.py's layout; its chunks, halves and headers are
``_ext/p2p.pyx``'s, which moves them in C): the sender publishes chunk c in half c % 2 and bumps its count of
chunks posted; the receiver copies it out and bumps its count of chunks taken. Chunk c may be written once
chunk c - 2 has been taken, so big messages stream through two halves. Every half starts with a header that
the receiver checks against what it expects.

Messages between two ranks arrive in the order they were sent; a tag is
checked, not used to reorder (a receive that finds another tag first raises).

Single copy (``direct_from``: the least message that uses it, None for never):
the sender's one chunk is a header that gives its buffer's address instead of
data; the receiver reads the whole message from the sender's memory
(``process_vm_readv``) and takes the chunk, which ends the send. The
sender decides by the size; the receiver follows the header. Only messages
larger than the two halves: a sender waits for its receiver then, on either
path.

Transfers are non-blocking state machines: ``advance()`` moves data as far as
the channel allows (or, given a slice, waits for it that long in C) and returns.
A send or receive that can finish at once runs inline; the rest progress on the
group's p2p thread, so isend/irecv pairs in any order never deadlock. A caller
that waits for a transfer (``dist.recv`` always does) progresses them itself
meanwhile, and the thread stands aside: the caller sees its peer's chunk arrive
at once, where a hand-off to the thread and back costs two wake-ups. A receive
whose sender needs nobody to take its chunks (a message of at most two) does
not even wake the thread: it waits in the channel for the caller, unless the
caller asks for it otherwise (``TransferWork``).
"""
from __future__ import annotations

import threading
import time

from shmcoll import _p2p, _single_copy, _state, _sync, single_copy
from shmcoll.errors import ShmcollError
from shmcoll.waits import STEP_MASK
from shmcoll.work import AsyncWork, CompletedWork

# How long one C call of a transfer that a thread drives alone may wait before Python checks abort, deadlines
# and liveness again (``PointToPoint._move_alone``); also the p2p thread's sleep on one word.
MOVE_SLICE_NS = 1_000_000


def _waits(budgets, local_size: int) -> tuple:
    """A C move's (spin_ns, yield_ns, yield_company) from ``budgets`` (None: a move that does not wait)."""
    return (budgets.spin_ns, budgets.yield_ns, budgets.company(local_size)) if budgets else (0, 0, 0)


class _Transfer:
    """State shared by sends and receives: where the bytes are and how far they got."""

    def __init__(self, p2p, peer, addr: int, nbytes: int, tag: int, result):
        self.p2p = p2p
        self.peer = peer  # local rank, or None for a receive from any source
        self.addr = addr
        self.nbytes = nbytes
        self.tag = tag
        self.total = p2p.channels.chunks(nbytes)  # the message's chunks
        self.chunks = 0  # of them, moved
        self.done = False
        self.result = result
        self.last_progress = time.monotonic()
        self.warn_after = None  # idle seconds after which the next stall warning is due


class Send(_Transfer):
    kind = "send"

    def __init__(self, p2p, peer, addr: int, nbytes: int, tag: int, result):
        super().__init__(p2p, peer, addr, nbytes, tag, result)
        # Never a message that fits the channel's two halves: those the copy path sends without waiting for
        # the receiver, and a sender may rely on that (a message nobody receives yet, then a collective).
        self.direct = (p2p.direct_from is not None and 2 * p2p.channels.payload < nbytes
                       and p2p.direct_from <= nbytes)
        self.read_by = None  # a direct send: the chunks taken that say the receiver has read our buffer

    def key(self):
        return ("send", self.peer)

    def describe(self) -> str:
        return f"send of {self.nbytes} bytes (tag {self.tag}) to rank {self.p2p.ranks[self.peer]}"

    def advance(self, slice_ns: int = 0, budgets=None) -> bool:
        channels = self.p2p.channels
        if self.read_by is not None:
            if slice_ns > 0 and not channels.taken_by(self.peer, self.read_by):
                lines, line, target = self.wait_target()
                _sync.wait_rank(lines, line, target, budgets.spin_ns, budgets.yield_ns, slice_ns)
            self.done = channels.taken_by(self.peer, self.read_by)
            return self.done
        if self.direct:
            read_by = channels.post_address(self.peer, self.addr, self.nbytes, self.tag)
            if read_by < 0:
                return False
            self.read_by = read_by  # not done: the receiver reads it all
            return True
        before = self.chunks
        self.chunks = channels.send(self.peer, self.addr, self.nbytes, self.tag, before, slice_ns,
                                    *_waits(budgets, self.p2p.size))
        self.done = self.chunks >= self.total
        return self.chunks > before

    def wait_target(self):
        if self.read_by is not None:
            lines, line, _ = self.p2p.channels.send_target(self.peer)
            return lines, line, self.read_by & STEP_MASK
        return self.p2p.channels.send_target(self.peer)


class Recv(_Transfer):
    kind = "recv"

    def key(self):
        return ("recv", self.peer)

    def describe(self) -> str:
        source = "any rank" if self.peer is None else f"rank {self.p2p.ranks[self.peer]}"
        return f"receive of {self.nbytes} bytes (tag {self.tag}) from {source}"

    def advance(self, slice_ns: int = 0, budgets=None) -> bool:
        p2p = self.p2p
        channels = p2p.channels
        if self.peer is None:  # any source: the first peer with a message waiting
            for peer in range(p2p.size):
                if peer != p2p.me and channels.ready(peer):
                    self.peer = peer
                    break
            else:
                return False
        before = self.chunks
        taken = channels.recv(self.peer, self.addr, self.nbytes, self.tag, before, slice_ns,
                              *_waits(budgets, p2p.size))
        if taken == _p2p.DIRECT_CHUNK:
            self._read(self.peer, channels.next_header(self.peer)[4])
            channels.take(self.peer)
            taken = self.total
        elif taken == _p2p.MISMATCH:
            tag, total = channels.next_header(self.peer)[:2]
            raise ShmcollError(
                f"rank {p2p.ranks[p2p.me]} expected a message of {self.nbytes} bytes with tag {self.tag} from "
                f"rank {p2p.ranks[self.peer]} but the next one sent has {total} bytes and tag {tag}; messages "
                f"between two ranks are delivered in the order sent")
        self.chunks = taken
        self.done = taken >= self.total
        return taken > before

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
        return self.p2p.channels.recv_target(self.peer)


class TransferWork(AsyncWork):
    """A transfer's Work. One whose thread was not woken (``PointToPoint.start``) wakes it before anything but
    a plain ``wait()`` (which progresses the transfer itself): a wait with a timeout, a poll, a future."""

    def __init__(self, result, describe: str, p2p: PointToPoint, woken: bool):
        super().__init__(result, describe, p2p)
        self._woken = woken

    def _wake(self) -> None:
        if not self._woken:
            self._woken = True
            self._engine.wake()

    def wait(self, timeout=None) -> bool:
        if timeout and timeout.total_seconds() > 0:
            self._wake()
        return super().wait(timeout)

    def is_completed(self) -> bool:
        self._wake()
        return super().is_completed()

    def is_success(self) -> bool:
        self._wake()
        return super().is_success()

    def exception(self):
        self._wake()
        return super().exception()

    def get_future(self):
        self._wake()
        return super().get_future()


class PointToPoint:
    """One group's channels on this rank, and the thread that progresses pending transfers."""

    def __init__(self, arena, name: str, direct_from: int | None, budgets):
        self.arena = arena
        self.direct_from = direct_from  # the least message read from the sender's buffer (None: none)
        self.me = arena.local_rank
        self.size = arena.local_size
        self.ranks = arena.ranks
        self.channels = _p2p.Channels(arena.channel_lines, arena.channel_data, arena.p2p_bytes, self.me, self.size,
                                      arena.lines)
        self._budgets = budgets  # of a caller's waits (the thread's: the arena's at the time)
        self._name = name
        self.lock = lock = threading.Lock()  # of everything below; held while a transfer moves, but by _move_alone
        self._cv = threading.Condition(lock)  # whoever waits for a moving transfer's slice to end
        self._idle = threading.Condition(lock)  # the thread, while it has nothing to do or helpers do it
        # The pending (transfer, Work) pairs in issue order, and whether closed: what the compiled small transfers
        # ask too (``Backlog.idle``), under ``lock``.
        self.backlog = _state.Backlog([])
        self._thread: threading.Thread | None = None
        self._helpers = 0  # callers progressing transfers in ``help``: the thread sleeps meanwhile
        self._moving = False  # a thread moves a transfer without the lock (``_move_alone``): nobody else may
        self._watch = arena.watch  # the arena's wait checks: liveness, timeout, abort (shmcoll.waits)

    # -- issuing ---------------------------------------------------------------

    def start(self, transfer: _Transfer):
        """Finish ``transfer`` inline if it can, else queue it; return its Work."""
        with self._cv:
            if self.backlog.closed:
                raise ShmcollError(f"point-to-point engine {self._name} was shut down")
            if not self.backlog.queue:
                transfer.advance()
                if transfer.done:
                    return CompletedWork(transfer.result, self._source(transfer))
            # A receive whose sender posts every chunk without it waits for its caller; the rest need the thread.
            woken = not (transfer.kind == "recv" and transfer.total <= 2)
            work = TransferWork(transfer.result, transfer.describe, self, woken)
            self.backlog.queue.append((transfer, work))
            if woken:
                self._wake()
        return work

    def wake(self) -> None:
        """Have the thread progress what is pending (a Work that left it asleep is asked for more than wait())."""
        with self._cv:
            if not self.backlog.closed:
                self._wake()

    def _wake(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"shmcoll-p2p-{self._name}", daemon=True)
            self._thread.start()
        self._idle.notify()

    def _source(self, transfer) -> int:
        return self.ranks[transfer.peer] if transfer.kind == "recv" else -1

    # -- progress --------------------------------------------------------------

    def _advance_all(self) -> bool:
        """One pass over pending transfers, FIFO per channel; True if any moved (the lock held)."""
        moved = False
        blocked: set = set()
        any_recv_blocked = False
        still = []
        for transfer, work in self.backlog.queue:
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
        self.backlog.queue = still
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

    def _alone(self):
        """The one pending transfer, where one thread may move it without the lock (its peer known, nobody
        moving already), marked as moved; else None. The lock held."""
        if len(self.backlog.queue) != 1 or self._moving:
            return None
        transfer, work = self.backlog.queue[0]
        if transfer.peer is None:
            return None
        self._moving = True
        return transfer, work

    def _move_alone(self, transfer, work, budgets) -> None:
        """Move ``transfer`` (``_alone``'s) for one slice in C, the lock not held: a caller that waits for it,
        or the thread streaming it, pays one call per slice instead of one pass per chunk. Meanwhile
        ``start`` only queues (something is pending), and nobody else advances or unmaps (``_moving``)."""
        error, moved = None, False
        try:
            moved = transfer.advance(MOVE_SLICE_NS, budgets)
        except BaseException as exc:  # delivered to the work's waiter, never lost
            error = exc
        finally:  # whatever arrives meanwhile (a KeyboardInterrupt), the transfer stops moving
            with self._cv:
                self._moving = False
                if self.backlog.queue and self.backlog.queue[0][1] is work:  # else close() failed it meanwhile
                    if error is None:
                        if moved:
                            transfer.last_progress = time.monotonic()
                        try:
                            self._check_stalled(transfer)
                        except BaseException as exc:
                            error = exc
                    if error is not None or transfer.done:
                        del self.backlog.queue[0]
                        work.finish(error, None if error is not None else self._source(transfer))
                self._cv.notify_all()  # helpers and close() wait while a transfer moves

    def _single_target(self):
        """The word the one pending transfer waits for (the lock held), or None."""
        return self.backlog.queue[0][0].wait_target() if len(self.backlog.queue) == 1 else None

    def _wait_for_peers(self, single, idle_passes: int) -> None:
        """Between passes that moved nothing (no lock held): sleep on ``single`` (spin, yield, futex; one slice
        at most), else back off."""
        if single is not None:
            lines, index, target = single
            budgets = self.arena.budgets
            _sync.wait_rank(lines, index, target, budgets.spin_ns, budgets.yield_ns, MOVE_SLICE_NS)
        else:
            time.sleep(0 if idle_passes < 50 else min(1e-3, 1e-5 * idle_passes))

    def _loop(self) -> None:
        idle_passes = 0
        while True:
            with self._cv:
                while not self.backlog.queue or self._helpers or self._moving:
                    if self.backlog.closed:
                        return
                    self._idle.wait()
                    idle_passes = 0
                alone = self._alone()
                if alone is None:
                    moved = self._advance_all()
                    single = self._single_target()
            if alone is not None:
                self._move_alone(*alone, self.arena.budgets)
                alone = None  # the thread may sleep next: it keeps no transfer (its tensors) or Work alive
                continue
            if moved:
                idle_passes = 0
            else:
                idle_passes += 1
                self._wait_for_peers(single, idle_passes)

    def help(self, work: TransferWork) -> None:
        """Progress the pending transfers on this thread until ``work`` is done, the thread standing aside: the
        one pending alone in C, several in the thread's passes (so order, stall checks and errors are the
        thread's)."""
        if threading.current_thread() is self._thread:
            return
        with self._cv:
            self._helpers += 1
        try:
            idle_passes = 0
            while not work.ended:
                with self._cv:
                    if self.backlog.closed:
                        return  # close() finished every pending work
                    if self._moving:
                        self._cv.wait()  # until the slice of whoever moves a transfer ends
                        continue
                    alone = self._alone()
                    if alone is None:
                        moved = self._advance_all()
                        single = self._single_target()
                if alone is not None:
                    self._move_alone(*alone, self._budgets)
                    continue
                if work.ended:
                    return
                if moved:
                    idle_passes = 0
                else:
                    idle_passes += 1
                    self._wait_for_peers(single, idle_passes)
        finally:
            with self._cv:
                self._helpers -= 1
                if not self._helpers and self.backlog.queue and self._thread is not None:
                    self._idle.notify()  # what is left is the thread's again

    def close(self) -> None:
        with self._cv:
            self.backlog.closed = True
            for _, work in self.backlog.queue:
                work.finish(ShmcollError(f"{self._name}: process group shut down with this transfer pending"))
            self.backlog.queue = []
            self._idle.notify()
            while self._moving:  # a transfer in C reads the arena, which is unmapped after this
                self._cv.wait()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
