"""The shared arena: one segment per (process group, node), its layout and lifecycle.

Terms:
  slot     ``chunk_bytes`` of the segment owned by one local rank in one buffer;
           only its owner writes it.
  buffer   L slots, one per local rank, laid out back to back. There are two;
           step s uses buffer s % 2, so data of step s+1 can be written while
           slower peers still read step s (no trailing barrier).
  step     see ``_sync``: each rank's published sequence number. Posting step s
           means "my data for s is in my slot and I finished every read of
           steps < s". Hence a rank may write buffer s % 2 once all peers have
           reached s - 1.
  chunk    the part of a large message handled in one step or step pair; at
           most ``chunk_bytes`` per rank, small enough to stay in cache.
  table    a row of int64 words per local rank in each buffer, beside the slots:
           sizes a collective agrees on in its first step (all_to_all's
           per-pair sizes), so they take no room from the data.
  scratch  ``chunk_bytes`` per rank that only its owner touches, for results
           computed within one step (a slot of the other buffer is not
           private: the next collective's root may write every slot of it).
  channel  a one-way path for point-to-point messages from one local rank to
           another: two control lines (sender's sequence, receiver's
           acknowledgement) and two halves of ``p2p_bytes / 2`` (see p2p.py).

Lifecycle: the lowest local rank creates the segment exclusively (mode 0600,
space reserved) without a name where the filesystem allows it (O_TMPFILE; the
others open /proc/<pid>/fd/<fd>), else under a random name, publishes its path
through the group's store, and unlinks a name once every local rank has mapped
it; ``open_arena`` returns on no rank before any name is gone, so nothing can
leak after that point.
"""
from __future__ import annotations

import errno
import os
import secrets
from datetime import timedelta
from typing import NamedTuple

import numpy as np

from shmcoll import _schedules, _segment, _single_copy, _state, _sync
from shmcoll import descriptors, streaming, waits
from shmcoll.errors import AttachError, CollectiveError, PeerAttachError, PeerDiedError, ShmcollError
from shmcoll.waits import GAVE_UP, IN_GROUP, LEFT, STEP_MASK

MAGIC = 0x324C4C4F434D4853  # "SHMCOLL2" little-endian: the header below
HEADER_BYTES = 256
# uint64 words of the header. The creator writes what the layout was derived from, and every rank
# that maps the segment checks it against what it derived itself (``_check_header``).
MAGIC_WORD, LOCAL_SIZE_WORD, CHUNK_WORD, P2P_WORD, SIZE_WORD, LANES_WORD = 0, 1, 2, 3, 4, 5
LINE_BYTES = _sync.LINE_BYTES
PID_OFFSET = _sync.PID_OFFSET  # of a rank's pid in its control line (_ext/schedule.pxd has the line's layout)
STANDING_OFFSET = _sync.STANDING_OFFSET  # of a rank's standing in the group (waits.IN_GROUP ...) in its control line
PAGE = 4096
NAME_PREFIX = "shmcoll-"

_SLICE_NS = waits.SLICE_NS


class Layout(NamedTuple):
    """Byte offsets of the arena's regions; every rank derives the same from the settings."""

    lines: int  # one control line per local rank
    channel_lines: int  # two control lines per (source, destination) channel
    lane_lines: int  # MAX_LANES sets of one control line per local rank (shmcoll.lanes)
    tables: int  # two buffers of local_size tables of table_bytes(local_size)
    data: int  # two buffers of local_size slots of chunk_bytes
    scratch: int  # local_size private areas of chunk_bytes
    channels: int  # local_size**2 channels of p2p_bytes
    lanes: int  # where the group has several lanes, each one's own: two buffers of local_size slots and
    #             local_size private areas, all of lane_bytes(chunk_bytes)
    total: int


# Most lanes (threads per rank) a large collective can be split into; each has its own control
# lines (16 x 128 B per local rank) and, in a group that has several, slots of its own.
MAX_LANES = 16


def lane_bytes(chunk_bytes: int) -> int:
    """Bytes of each slot (and private area) of a lane: half the arena's own, so that 8 lanes of 2 ranks
    add 12 MiB (with the default 512 KiB chunk) and each step still moves 256 KiB, against which a step's
    synchronisation (a few hundred nanoseconds) is small."""
    return chunk_bytes // 2 // 64 * 64


def table_words(local_size: int) -> int:
    """int64 words of a rank's table (all_to_all's size tables: ``_ext/size_tables.pxi``)."""
    return _schedules.size_table_words(local_size)


def table_bytes(local_size: int) -> int:
    """Bytes of a rank's table, rounded up to whole cache lines (no two ranks write one line)."""
    return -(-table_words(local_size) * 8 // 64) * 64


def layout(local_size: int, chunk_bytes: int, p2p_bytes: int, lanes: int = 1) -> Layout:
    """Where everything lives in a segment for ``local_size`` ranks whose collectives use up to ``lanes``
    lanes (one: none of the lanes' slots)."""
    channel_lines = HEADER_BYTES + local_size * LINE_BYTES
    lane_lines = channel_lines + local_size * local_size * 2 * LINE_BYTES
    tables = lane_lines + MAX_LANES * local_size * LINE_BYTES
    data = _page_up(tables + 2 * local_size * table_bytes(local_size))
    scratch = data + 2 * local_size * chunk_bytes
    channels = scratch + local_size * chunk_bytes
    lane_data = channels + local_size * local_size * p2p_bytes
    lane_region = 3 * local_size * lane_bytes(chunk_bytes) * lanes if lanes > 1 else 0
    return Layout(HEADER_BYTES, channel_lines, lane_lines, tables, data, scratch, channels, lane_data,
                  lane_data + lane_region)


def _page_up(offset: int) -> int:
    return (offset + PAGE - 1) // PAGE * PAGE


class Steps(_state.StepCount):
    """One sequence of steps over one set of control lines (one line per local rank), and the
    C schedules that run over the buffers it owns: the whole arena's, or one lane's. Where it stands
    (``step``, ``all_reached``) is kept in C by its base, for the compiled small collectives."""

    def __init__(self, arena: "Arena", lines: int, chunk_bytes: int, data: int, scratch: int):
        self.arena = arena
        self.lines = lines
        self.local_rank = arena.local_rank
        self.local_size = arena.local_size
        self.chunk_bytes = chunk_bytes  # of every slot and of our scratch, from data and scratch on
        self.watch = arena.watch
        self.budgets = arena.budgets
        self.yield_company = self.budgets.company(self.local_size)
        self.step = 0  # last step this rank posted
        self.all_reached = 0  # highest step every local rank is known to have reached
        # Reductions and bulk moves run whole in C over these buffers (shmcoll._schedules).
        self.schedule = _schedules.Schedule(lines, self.local_rank, self.local_size, data, scratch, chunk_bytes,
                                         arena.slot_stride, self.budgets.spin_ns, self.budgets.yield_ns,
                                         self.yield_company, _SLICE_NS)
        self.schedule.set_streaming(arena.stream_bytes)

    def set_waits(self, budgets: waits.Budgets) -> None:
        """The budgets of the waits that follow (the futex sleep comes after them)."""
        if budgets != self.budgets:
            self.budgets, self.yield_company = budgets, budgets.company(self.local_size)
            self.schedule.set_waits(budgets.spin_ns, budgets.yield_ns, self.yield_company)

    def begin_write(self) -> int:
        """The step about to be posted, once its buffer is free to overwrite."""
        step = self.step + 1
        if self.all_reached < step - 1:
            self.wait_all(step - 1)
        return step

    def post(self, step: int, desc: int) -> None:
        """Publish ``step`` with the descriptor of the collective it belongs to."""
        self.step = step
        _sync.post(self.lines, self.local_rank, step & STEP_MASK, desc)

    def next_step(self) -> int:
        """The step after the last one posted, for a post that writes nothing (so needs no free buffer)."""
        return self.step + 1

    def record_schedule(self, last_step: int, all_reached: int = 0) -> None:
        """Note what a C schedule (``shmcoll._schedules``) did without Python: it posted every step up to
        ``last_step`` and saw every local rank reach ``all_reached`` (0: nothing new known)."""
        self.step = last_step
        if all_reached > self.all_reached:
            self.all_reached = all_reached

    def wait_all(self, step: int) -> None:
        """Block until every local rank has reached ``step``."""
        behind = _sync.wait_ranks(self.lines, 0, self.local_size, self.local_rank, step & STEP_MASK,
                                  self.budgets.spin_ns, self.budgets.yield_ns, _SLICE_NS, self.yield_company)
        if behind >= 0:
            self._wait_slow(range(self.local_size), step)
        if step > self.all_reached:
            self.all_reached = step

    def wait_rank(self, local_rank: int, step: int) -> None:
        """Block until ``local_rank`` has reached ``step``."""
        if not _sync.wait_rank(self.lines, local_rank, step & STEP_MASK, self.budgets.spin_ns,
                               self.budgets.yield_ns, _SLICE_NS, self.local_rank, self.yield_company):
            self._wait_slow((local_rank,), step)

    def check_same_collective(self, step: int, desc: int, among=None, lines: int | None = None) -> None:
        """Raise if a peer published ``step`` for a different collective than ours (on these steps' lines, or
        on ``lines``: a lane's)."""
        lines = self.lines if lines is None else lines
        first, stop = (0, self.local_size) if among is None else (among, among + 1)
        other = _sync.first_mismatch(lines, first, stop, step & STEP_MASK, desc)
        if other >= 0:
            ranks = self.arena.ranks
            raise CollectiveError(
                f"mismatched collectives: rank {ranks[self.local_rank]} called "
                f"{descriptors.describe(desc)} but rank {ranks[other]} called "
                f"{descriptors.describe(_sync.load_desc(lines, other, step & STEP_MASK))} at the same point"
            )

    def _wait_slow(self, local_ranks, step: int) -> None:
        """The rest of a wait whose first slice ended: in slices, through the one funnel (``shmcoll.waits``)."""
        describe = self.arena.describe
        waits.until_reached(self.watch, self.lines, local_ranks, step,
                            lambda: describe() if describe else f"step {step}")


class Arena(Steps):
    """This rank's handle on the node's shared segment: slots, steps and waits.

    Its own steps serve every collective; a large one may instead run in
    several lanes at once (``lane_schedules``, ``shmcoll.lanes``), each with steps
    and slots of its own.
    """

    def __init__(self, segment, local_rank: int, local_size: int, chunk_bytes: int, p2p_bytes: int,
                 timeout: timedelta, budgets: waits.Budgets, ranks: list[int], lanes: int = 1):
        self.segment = segment
        self.local_rank = local_rank
        self.local_size = local_size
        self.p2p_bytes = p2p_bytes
        self.lane_count = lanes  # agreed by the node's ranks when the arena was made (its layout depends on it)
        self.timeout_s = timeout.total_seconds()
        self.budgets = budgets  # of the waits on the peers (Steps.set_waits)
        self.ranks = ranks  # group rank of each local rank, for messages
        base = segment.address
        regions = layout(local_size, chunk_bytes, p2p_bytes, lanes)
        self.channel_lines = base + regions.channel_lines
        self.channel_data = base + regions.channels
        self._lane_lines = base + regions.lane_lines
        self._lane_data = base + regions.lanes
        self._tables = regions.tables
        self.data = base + regions.data
        self.scratch = base + regions.scratch + local_rank * chunk_bytes  # ours alone
        self.slot_stride = chunk_bytes
        self.buffer_bytes = local_size * chunk_bytes
        self._raw = np.frombuffer(segment, dtype=np.uint8)
        self._views: dict[tuple[int, np.dtype], np.ndarray] = {}
        self._line_words = self._raw[HEADER_BYTES:HEADER_BYTES + local_size * LINE_BYTES].view(np.int32)
        self.describe = None  # set by the group: () -> text naming the collective in progress, for errors
        self.watch = waits.Watch(local_rank, ranks, self.timeout_s, self.pid, self.standing)
        self._lanes: list = []  # the lanes' schedules (lane_schedules), once asked for
        self.single_copy = None  # the single-copy schedules, once the node agreed to use them
        # The least all-gather output per rank its schedules write with streaming stores (this rank's decision:
        # it changes no result and no step).
        self.stream_bytes = streaming.least_output_bytes(local_size)
        super().__init__(self, base + regions.lines, chunk_bytes, self.data, self.scratch)

    # -- layout --------------------------------------------------------------

    def slot(self, buffer: int, local_rank: int) -> int:
        """Address of ``local_rank``'s slot in ``buffer``."""
        return self.data + buffer * self.buffer_bytes + local_rank * self.chunk_bytes

    def channel(self, source: int, destination: int) -> tuple[int, int]:
        """(control lines, data) addresses of the channel from ``source`` to ``destination``."""
        index = source * self.local_size + destination
        return (self.channel_lines + index * 2 * LINE_BYTES, self.channel_data + index * self.p2p_bytes)

    def lane_schedules(self) -> list:
        """One C Schedule per lane (``lane_count`` of them): lane j's control lines and its own two buffers of
        slots and private areas (``layout``), for ``shmcoll.lanes``, which drives them in C."""
        if not self._lanes and self.lane_count > 1:
            width = lane_bytes(self.chunk_bytes)
            size = self.local_size
            for j in range(self.lane_count):
                data = self._lane_data + j * 3 * size * width
                self._lanes.append(_schedules.Schedule(
                    self._lane_lines + j * size * LINE_BYTES, self.local_rank, size, data,
                    data + (2 * size + self.local_rank) * width, width, width, 0, 0, 0, _SLICE_NS))
                self._lanes[-1].set_streaming(self.stream_bytes)
            self._set_lane_waits()
        return self._lanes

    @property
    def lanes_oversubscribe(self) -> bool:
        """Whether the node's lane threads outnumber the CPUs this rank may use."""
        return self.local_size * self.lane_count > len(os.sched_getaffinity(0))

    def tables(self, buffer: int) -> np.ndarray:
        """``buffer``'s tables as a (local_size, table_words) int64 array; row r is rank r's, written by it
        alone before it posts a step of that buffer, as its slot is."""
        view = self._views.get((buffer, "tables"))
        if view is None:
            size = self.local_size
            row = table_bytes(size)
            start = self._tables + buffer * size * row
            view = self._raw[start:start + size * row].view(np.int64).reshape(size, -1)[:, :table_words(size)]
            self._views[(buffer, "tables")] = view
        return view

    def set_waits(self, budgets: waits.Budgets) -> None:
        super().set_waits(budgets)
        self._set_lane_waits()
        if self.single_copy is not None:
            self.single_copy.set_waits(budgets.spin_ns, budgets.yield_ns, self.yield_company)

    def enable_single_copy(self) -> None:
        """Collectives may read the peers' buffers directly (``shmcoll.single_copy`` found it allowed, and
        ``placement.node.single_copy_spans`` worth it), over this arena's control lines, with our scratch
        for the pieces of a reduction."""
        self.single_copy = _single_copy.SingleCopy(self.lines, self.local_rank, self.local_size, self.scratch,
                                                   self.chunk_bytes, self.budgets.spin_ns, self.budgets.yield_ns,
                                                   self.yield_company, _SLICE_NS)

    def _set_lane_waits(self) -> None:
        budgets = waits.lane_budgets(self.budgets, self.lanes_oversubscribe)
        company = budgets.company(self.local_size)
        for lane in self._lanes:
            lane.set_waits(budgets.spin_ns, budgets.yield_ns, company)

    def abort(self, why: str) -> None:
        """Every wait on this arena raises within a slice, here (``why``) and on the local peers (``abandon``)."""
        self.watch.abort(why)
        self.abandon()

    def abandon(self) -> None:
        """Tell the local ranks that this one gives up mid-collective (its next steps will never come).

        Their waits for it check its standing once per slice, so they raise within a fraction of a second
        instead of waiting out the timeout for a rank that is alive.
        """
        self._stand(GAVE_UP)

    def _stand(self, standing: int) -> None:
        """Post this rank's standing, once: the first (why it takes no further step) is what the peers name."""
        if self._line_words is not None:
            word = (self.local_rank * LINE_BYTES + STANDING_OFFSET) // 4
            if self._line_words[word] == IN_GROUP:
                self._line_words[word] = standing

    def standing(self, local_rank: int) -> int:
        """``local_rank``'s standing in the group: IN_GROUP, GAVE_UP (``abandon``) or LEFT (``close``)."""
        return int(self._line_words[(local_rank * LINE_BYTES + STANDING_OFFSET) // 4])

    def exited_peers(self) -> list[int]:
        """The group ranks of the local peers whose process has exited (``waits.process_alive``), whatever
        this rank was waiting for: a plan across nodes that fails on the network asks, to name a dead node mate."""
        return [self.ranks[r] for r in range(self.local_size)
                if r != self.local_rank and not waits.process_alive(self.pid(r))]

    def pid(self, local_rank: int) -> int:
        """Process id that ``local_rank`` recorded in its control line."""
        return int(self._line_words[(local_rank * LINE_BYTES + PID_OFFSET) // 4])

    def _record_pid(self) -> None:
        self._line_words[(self.local_rank * LINE_BYTES + PID_OFFSET) // 4] = os.getpid()

    def close(self) -> None:
        """Tell the local ranks that this one left the group (a peer still waiting for a step of ours would wait
        for it until the timeout), then drop this rank's mapping (views first, so the unmap happens now)."""
        self._stand(LEFT)
        self._views.clear()
        self._raw = self._line_words = None
        self.segment.close()


def open_arena(store, local_rank: int, local_size: int, ranks: list[int], settings, timeout: timedelta,
               budgets: waits.Budgets, key: str = "shmcoll/arena", lanes: int = 1) -> Arena:
    """Create (lowest local rank) or attach the node's segment; returns once it has no name.

    The segment is created without a name (O_TMPFILE) where the filesystem
    allows it, and the others open it through /proc/<creator pid>/fd/<fd>: there
    is no moment at which a SIGKILL could leave it behind. Otherwise it gets a
    random name that is unlinked once everyone mapped it. If the creator fails,
    it publishes its error so that the others raise it too instead of waiting.
    A rank that cannot map what the creator made raises AttachError, and the
    creator then PeerAttachError (shmcoll.node_arena runs that rank on its own).
    """
    size = layout(local_size, settings.chunk_bytes, settings.p2p_bytes, lanes).total
    me = ranks[local_rank]
    if local_rank == 0:
        try:
            segment = _create_unique(settings.shm_dir, size, local_size)
        except Exception as error:
            store.set(key, _ERROR + f"{type(error).__name__}: {error}")
            if local_size > 1:  # let them read it before our store (env://) may go away with us
                try:
                    store.wait([f"{key}/mapped"], min(timeout, timedelta(seconds=10)))
                except Exception:
                    pass
            raise
        named = segment.fd < 0
        try:
            _init_header(segment, local_size, settings.chunk_bytes, settings.p2p_bytes, lanes)
            store.set(f"{key}/pidns", _pid_namespace())
            store.set(key, segment.path)
            if local_size > 1:
                store.wait([f"{key}/mapped"], timeout)
        finally:
            if named:
                _segment.unlink_path(segment.path)
            segment.release_fd()
        store.set(f"{key}/unlinked", "1")
        if store.check([f"{key}/failed"]):
            raise PeerAttachError(f"could not set up the shm arena: {store.get(f'{key}/failed').decode()}")
    else:
        store.wait([key], timeout)
        name = store.get(key).decode()
        try:
            if name.startswith(_ERROR):
                raise OSError(f"rank {ranks[0]} could not create the shm arena: {name[len(_ERROR):]}")
            segment = _map_created(name, size, settings, ranks, local_rank, store.get(f"{key}/pidns").decode())
            _check_header(segment, local_size, settings.chunk_bytes, settings.p2p_bytes, lanes, ranks)
        except Exception as error:
            if not name.startswith(_ERROR):  # tell the creator, which is waiting for us
                store.set(f"{key}/failed", str(error) if isinstance(error, ShmcollError)
                          else f"rank {me} could not map it: {error}")
            raise
        finally:
            if store.add(f"{key}/count", 1) == local_size - 1:
                store.set(f"{key}/mapped", "1")
        store.wait([f"{key}/unlinked"], timeout)
    arena = Arena(segment, local_rank, local_size, settings.chunk_bytes, settings.p2p_bytes, timeout, budgets,
                  ranks, lanes)
    arena._record_pid()
    return arena


_ERROR = "error:"


def _map_created(name: str, size: int, settings, ranks: list[int], local_rank: int, creator_pidns: str):
    """Map the segment that local rank 0 published as ``name`` (its path: /proc/PID/fd/N, or a name in its
    SHMCOLL_SHM_DIR, which need not be ours).

    Raises AttachError where this rank cannot reach it while the creator is fine
    (the group then runs this rank as a node of its own), PeerDiedError where the
    creator is gone.
    """
    me, creator = ranks[local_rank], ranks[0]
    ours = _pid_namespace()
    if ours != creator_pidns:
        # /proc/PID/fd/N names another process there, and the liveness checks of every
        # wait (pids in the control lines) would look at the wrong processes.
        raise AttachError(f"rank {me} could not map the shm arena of rank {creator}: they are in different "
                          f"PID namespaces ({ours} vs {creator_pidns}), so its /proc/PID/fd is out of reach")
    try:
        if name.startswith("/proc/"):
            try:
                return _segment.attach(name, size, follow=True)
            except FileNotFoundError:
                raise PeerDiedError(f"rank {creator} (which created the shm arena) exited before rank "
                                    f"{me} could map it") from None
        return _segment.attach(name, size)
    except OSError as error:
        raise AttachError(f"rank {me} could not map the shm arena of rank {creator}: {error}") from error


def _pid_namespace() -> str:
    """This process's PID namespace ('pid:[4026531836]'); ranks of one arena must share it."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "unknown"


def _create_unique(directory: str, size: int, local_size: int):
    """Create the segment: unnamed if the filesystem can, else under a fresh unguessable name."""
    try:
        return _explain_enospc(_segment.create_unnamed, directory, size, local_size)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    for _ in range(16):
        path = os.path.join(directory, f"{NAME_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
        try:
            return _explain_enospc(_segment.create, path, size, local_size)
        except FileExistsError:
            continue
    raise FileExistsError(f"could not find a free segment name in {directory}")


def _explain_enospc(create, where: str, size: int, local_size: int):
    try:
        return create(where, size)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise OSError(
                error.errno,
                f"{error.strerror} (the shm arena of {local_size} local ranks). "
                f"Lower SHMCOLL_CHUNK_BYTES or SHMCOLL_P2P_BYTES, or set SHMCOLL_THREADS=1 (no lanes' slots), "
                f"to shrink it, point SHMCOLL_SHM_DIR at a larger tmpfs, or enlarge /dev/shm (docker run "
                f"--shm-size=...)",
            ) from None
        raise


def _init_header(segment, local_size: int, chunk_bytes: int, p2p_bytes: int, lanes: int = 1) -> None:
    header = np.frombuffer(segment, dtype=np.uint64, count=HEADER_BYTES // 8)
    header[LOCAL_SIZE_WORD] = local_size
    header[CHUNK_WORD] = chunk_bytes
    header[P2P_WORD] = p2p_bytes
    header[LANES_WORD] = lanes
    header[SIZE_WORD] = segment.size
    header[MAGIC_WORD] = MAGIC
    del header


def _check_header(segment, local_size: int, chunk_bytes: int, p2p_bytes: int, lanes: int, ranks: list[int]) -> None:
    """Raise unless the creator laid the segment out as this rank would: ranks that derived different
    layouts would read each other's data at the wrong offsets (a wrong result, not an error)."""
    header = np.frombuffer(segment, dtype=np.uint64, count=HEADER_BYTES // 8)
    found = {"magic": int(header[MAGIC_WORD]), "local ranks": int(header[LOCAL_SIZE_WORD]),
             "chunk bytes": int(header[CHUNK_WORD]), "p2p bytes": int(header[P2P_WORD]),
             "lanes": int(header[LANES_WORD]), "size": int(header[SIZE_WORD])}
    del header
    expected = {"magic": MAGIC, "local ranks": local_size, "chunk bytes": chunk_bytes, "p2p bytes": p2p_bytes,
                "lanes": lanes, "size": segment.size}
    wrong = [f"{what} {found[what]:#x} (expected {value:#x})" if what == "magic"
             else f"{what} {found[what]} (expected {value})" for what, value in expected.items() if found[what] != value]
    if wrong:
        raise ShmcollError(f"rank {ranks[0]} laid out the shm arena of ranks {', '.join(map(str, ranks))} "
                           f"otherwise than this rank would: {', '.join(wrong)}")
