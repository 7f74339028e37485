"""all_to_all across nodes: sizes agreed first; small ones in one exchange between each pair of leaders.

Every rank knows only its own sizes (what it sends to each rank, what it expects
from each), and Gloo ends the process when a message's size is not the one its
receiver expects. So the plan starts on the leaders: a node gather brings each
leader every local rank's sizes (and its blocks, when they are small), the
leaders exchange their nodes' size tables, so each holds all of them and reaches
the same verdict (consistent or not, small or large, the longest block), and a
node scatter brings every rank the verdict. Sizes that disagree raise the same
SizesDisagreeError on every rank, before any data moves; the group stays usable.

Small messages (every rank sends and receives at most SHMCOLL_SMALL_BYTES) ride
along: the leaders exchange the data, one message per pair of nodes, and the
node scatter brings each rank its blocks; only the leaders touch the network.
Blocks that fit the header's room (at least 1 KiB per rank, more after small calls
that sent more: ``FIRST_ROOM``) ride inside the size header itself (one network
round); larger small ones follow it (another round: Gloo receives by rendezvous).

Large ones go straight from rank to rank between nodes, every message posted at
once on the pair's own connection (the group of all ranks, ``Links.pairs``),
while the node's own blocks go through the arena. Relaying them through one
rank per node and rail (one message per pair of nodes) moves the same bytes with
three more copies of each: on the shaped link it reached 94% of the bound, but
where the nodes' cores were the limit it took 2.3 times Gloo's time.

A large one whose sizes every rank also gave the one before (a model's layer,
called again) skips the agreement: its blocks leave at once at the sizes agreed
before; a rank whose sizes changed sends stand-ins a few bytes short instead,
which its receivers see by a random tail they put at the end of each buffer
(a full block overwrites it). Every rank hears every rank, so all know alike
whether to start the call again through the leaders. So a large all_to_all of
repeated sizes does not pay for the agreement, a network round before the first
byte (1 MiB per rank on the shaped link: 8.8 ms, against 9.05 ms with it;
BENCHMARKS.md).
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
import torch

from shmcoll.algorithms import alltoall as _alltoall
from shmcoll.errors import SizesDisagreeError
from shmcoll.placement.across import stages

_INT64 = 8
TAIL = 8  # bytes: what a rank whose sizes changed leaves out of each block it sends (``_as_before``)


class Agreed:
    """What a group's all_to_alls remember of the last one's agreement."""

    def __init__(self):
        self.row = None  # this rank's sizes as last agreed: what it sends to each rank, then what it expects
        self.table = None  # on a leader: the group's send sizes as last agreed
        # The last one was large with its predecessor's sizes on every rank: the next moves its blocks at
        # once, taking the sizes to be the same again (``_as_before``).
        self.repeat = False
        self.room = None  # on a leader: bytes per rank its headers carry (``FIRST_ROOM``)


def alltoall(shape, links, agreed, sends: list[torch.Tensor], recvs: list[torch.Tensor], desc: int) -> None:
    """``sends[r]``/``recvs[r]``: contiguous uint8 views of the block for/from group rank r."""
    if agreed.repeat and _as_before(shape, links, agreed, sends, recvs, desc):
        return
    if _through_leaders(shape, links, agreed, sends, recvs, desc):
        _direct(shape, links, sends, recvs, desc)


def _as_before(shape, links, agreed, sends, recvs, desc: int) -> bool:
    """The last all_to_all was large and had its predecessor's sizes on every rank (a model's layer, called
    again): move the blocks between nodes at once, at the sizes agreed before. Returns whether every rank
    still has those sizes (the same answer on every rank).

    A rank whose sizes changed says so by what it sends: stand-ins ``TAIL`` bytes shorter than the sizes
    its peers expect (Gloo takes a message shorter than the buffer posted for it, never a longer one).
    Every receiver first writes a random tail into the last ``TAIL`` bytes of each buffer it posts: a
    full message overwrites it, a short one leaves it. So every rank hears every other node's ranks in
    their blocks, and its own node's in the size table of the node's all_to_all, without a message of
    its own (one more message per pair cost 0.3-0.4 ms a call where the cores were the limit). Where a
    size changed the call starts again through the leaders, which agree on the new sizes or name the
    ranks that disagree. Nothing runs before the blocks leave: no round of agreement. (A short message
    never reaches the tail, so a change is never missed; a block that ends in the very 8 random bytes,
    one chance in 2**64, would start its receiver alone again: a mismatch error, not a wrong result.)
    """
    size = shape.size
    before = agreed.row
    changed = _sizes(sends, recvs) != before
    remote = shape.remote
    tail = torch.frombuffer(bytearray(os.urandom(TAIL)), dtype=torch.uint8)
    out, into = {}, {}
    for r in remote:
        sent, expected = max(before[r], TAIL), max(before[size + r], TAIL)
        if changed:
            out[r] = torch.empty(sent - TAIL, dtype=torch.uint8)
        elif sent == before[r]:
            out[r] = sends[r]
        else:  # a block shorter than the tail travels padded to it
            out[r] = torch.zeros(TAIL, dtype=torch.uint8)
            out[r][:before[r]] = sends[r]
        into[r] = recvs[r] if expected == before[size + r] and not changed else torch.empty(expected,
                                                                                           dtype=torch.uint8)
        into[r][-TAIL:] = tail
    blocks = links.pairs.swap(out, into)
    try:
        node_changed = _node_blocks(shape, sends, recvs, desc, changed=int(changed))
    except SizesDisagreeError:  # a local rank's sizes changed, and disagree: the leaders will name them
        node_changed = True
    links.pairs.wait(blocks)
    if changed or node_changed or any(torch.equal(into[r][-TAIL:], tail) for r in remote):
        return False
    for r in remote:
        if into[r] is not recvs[r]:
            recvs[r].copy_(into[r][:recvs[r].numel()])
    return True


def _direct(shape, links, sends, recvs, desc: int) -> None:
    """A large one, its sizes agreed: every block between nodes on its pair's own connection, all posted at
    once, while the node's own blocks go through the arena."""
    remote = shape.remote
    pairs = links.pairs
    pending = pairs.swap({r: sends[r] for r in remote}, {r: recvs[r] for r in remote})
    _node_blocks(shape, sends, recvs, desc)
    pairs.wait(pending)


def _node_blocks(shape, sends, recvs, desc: int, changed: int = 0) -> int:
    """The node's own blocks, through the arena (a node of one rank: its block to itself, unless its sizes
    ``changed``). ``changed`` rides in the arena all_to_all's size table; returns the largest any local
    rank gave."""
    if shape.arena is None:
        if not changed:
            recvs[shape.rank].copy_(sends[shape.rank])
        return changed
    local = shape.local_ranks
    return _alltoall.alltoall(shape.arena, [(sends[r].data_ptr(), sends[r].numel()) for r in local],
                              [(recvs[r].data_ptr(), recvs[r].numel()) for r in local], desc, flag=changed)


def _sizes(sends, recvs) -> tuple[int, ...]:
    """A rank's row of the group's size table: what it sends to each rank, then what it expects from each."""
    return tuple(t.numel() for t in sends) + tuple(t.numel() for t in recvs)


def _through_leaders(shape, links, agreed, sends, recvs, desc: int) -> bool:
    """Agree on the sizes and, where every rank sends and receives at most SHMCOLL_SMALL_BYTES, move the data
    too. Returns whether blocks are left to move.

    Each rank's row: its send sizes, its receive sizes, and its blocks when they fit (``cap`` bytes), so
    one node gather brings the leader everything; the leaders exchange their nodes' size tables, reach
    the same verdict, and, for a small one, exchange the data; one node scatter brings each rank the
    verdict and, for a small one, its blocks.
    """
    # A small one's blocks ride in the rows: room for the most a small one sends (``Shape.small``).
    size, L, me, cap = shape.size, shape.local_size, shape.local_rank, shape.small_bytes
    head = 2 * size * _INT64
    sizes = _sizes(sends, recvs)
    sent = sum(sizes[:size])
    row = np.zeros(head + cap, dtype=np.uint8)
    row[:head].view(np.int64)[:] = sizes
    if shape.small(sent):
        np.concatenate([t.numpy() for t in sends], out=row[head:head + sent])
    rows = np.empty((L, row.size), dtype=np.uint8) if me == 0 else None
    stages.gather(shape, row.ctypes.data, row.size, 0, [r.ctypes.data for r in rows] if me == 0 else [], desc)
    replies = np.zeros((L, _VERDICT * _INT64 + cap), dtype=np.uint8) if me == 0 else None
    if me == 0:
        _as_leader(shape, links, agreed, rows, replies, cap)
    reply = np.empty(_VERDICT * _INT64 + cap, dtype=np.uint8)
    stages.scatter(shape, [r.ctypes.data for r in replies] if me == 0 else [], reply.size, 0, reply.ctypes.data,
                   desc)
    verdict = _Verdict(*reply[:_VERDICT * _INT64].view(np.int64).tolist())
    agreed.row = None if verdict.wrong else sizes
    agreed.repeat = bool(verdict.repeat)
    if verdict.wrong:
        raise SizesDisagreeError(verdict.wrong - 1, verdict.receiver, verdict.sent, verdict.expected)
    if not verdict.done:
        return verdict.longest > 0
    offset = _VERDICT * _INT64
    for target in recvs:
        target.numpy()[:] = reply[offset:offset + target.numel()]
        offset += target.numel()
    return False


class _Verdict(NamedTuple):
    """What the leaders conclude of an all_to_all's sizes; every rank gets it as int64s."""

    wrong: int = 0  # 1 + the first sender whose sizes disagree with its receiver's; 0: none do
    receiver: int = 0  # that sender's receiver, and the bytes one sends and the other expects
    sent: int = 0
    expected: int = 0
    longest: int = 0  # the longest block
    done: int = 0  # a small all_to_all whose blocks came with the verdict
    repeat: int = 0  # a large one with the last agreed sizes on every rank: the next takes them to hold (_as_before)


_VERDICT = len(_Verdict._fields)
# What a leader's header says of its node's blocks for the receiving node.
_NO_DATA, _DATA_FOLLOWS, _DATA_INLINE = 0, 1, 2
# Blocks of a node whose ranks each send at most ``Agreed.room`` bytes ride inside the header,
# which is then one message each way between two leaders (a message after it costs another round: Gloo
# receives by rendezvous). Every header has that room, so that its length is known to both sides: at
# first this much, then what the last all_to_all's busiest rank sent if that one was small, else this
# much again (every leader derives it from the same verdict, so all agree on it without a word;
# all_to_alls of one shape, as a model repeats them, then take one round).
FIRST_ROOM = 1024


def _as_leader(shape, links, agreed, rows: np.ndarray, replies: np.ndarray, cap: int) -> None:
    """On a leader: every node's sizes, the data of a small one, the verdict and each local rank's reply.

    Each leader sends every other one a header of a length both sides know: its node's size table, and
    its node's blocks for that node when every local rank's fit the header's room; when they fit ``cap`` only,
    they follow in a message of their own, whose length the receiver reads in the table. So a message is
    never received with a size its sender did not give it, even where the sizes disagree (then every
    rank raises the verdict's error).
    """
    size, N, node, local = shape.size, len(shape.nodes), shape.node, shape.local_ranks
    head = 2 * size * _INT64
    table = rows[:, :head].view(np.int64)  # row l: what local rank l sends to each rank, then expects
    totals = table[:, :size].sum(axis=1)
    room = agreed.room or FIRST_ROOM
    others = [m for m in range(N) if m != node]
    flag = (_NO_DATA if not all(shape.small(int(total)) for total in totals) else
            _DATA_INLINE if _widest(table[:, :size], local, shape) <= room else _DATA_FOLLOWS)
    starts = head + np.cumsum(table[:, :size], axis=1) - table[:, :size]  # of each block, in its row

    def ours_for(m: int) -> np.ndarray:  # our blocks for node m: by source, then destination
        return np.concatenate([rows[l, starts[l, d]:starts[l, d] + table[l, d]]
                               for l in range(len(local)) for d in shape.nodes[m]])

    outbound = {m: ours_for(m) for m in others} if flag != _NO_DATA else {}
    link = links.leaders
    headers = {m: np.zeros(_header_bytes(len(shape.nodes[m]), size, room), dtype=np.uint8) for m in others}
    mine = {}
    for m in others:
        message = mine[m] = np.zeros(_header_bytes(len(local), size, room), dtype=np.uint8)
        message[:_INT64].view(np.int64)[0] = flag
        message[_INT64:_INT64 + table.nbytes] = table.reshape(-1).view(np.uint8)
        if flag == _DATA_INLINE:
            message[_INT64 + table.nbytes:_INT64 + table.nbytes + outbound[m].size] = outbound[m]
    link.wait(link.swap({m: torch.from_numpy(mine[m]) for m in others},
                        {m: torch.from_numpy(headers[m]) for m in others}))
    # The whole group's sizes: sends[a, b] what rank a sends rank b, expects[b, a] what b expects from a.
    sends, expects = np.empty((size, size), dtype=np.int64), np.empty((size, size), dtype=np.int64)
    flags, tables = {node: flag}, {node: table}
    for m in others:
        flags[m] = int(headers[m][:_INT64].view(np.int64)[0])
        tables[m] = headers[m][_INT64:_INT64 + len(shape.nodes[m]) * head].view(np.int64).reshape(-1, 2 * size)
    for n, ranks in enumerate(shape.nodes):
        sends[ranks] = tables[n][:, :size]
        expects[ranks] = tables[n][:, size:]
    incoming = {}  # node -> its blocks for us: by source, then destination
    for m in others:
        length = int(sends[np.ix_(shape.nodes[m], local)].sum())
        if flags[m] == _DATA_INLINE:
            incoming[m] = headers[m][_INT64 + len(shape.nodes[m]) * head:][:length]
        elif flags[m] == _DATA_FOLLOWS:
            incoming[m] = np.empty(length, dtype=np.uint8)
    follows = {m: torch.from_numpy(incoming[m]) for m in others if flags[m] == _DATA_FOLLOWS}
    pending = link.swap({m: torch.from_numpy(outbound[m]) for m in others} if flag == _DATA_FOLLOWS else {},
                        follows)
    link.wait(pending)
    verdict = _Verdict(longest=int(sends.max()))
    bad = np.argwhere(sends != expects.T)
    if len(bad):
        a, b = (int(x) for x in bad[0])
        verdict = verdict._replace(wrong=a + 1, receiver=b, sent=int(sends[a, b]), expected=int(expects[b, a]))
    small = all(f != _NO_DATA for f in flags.values()) and shape.small(int(expects.sum(axis=1).max()))
    previous, agreed.table = agreed.table, None if len(bad) else sends
    verdict = verdict._replace(repeat=int(not len(bad) and not small and previous is not None
                                          and np.array_equal(previous, sends)))
    # A large one's header carries no blocks, and the next all_to_all is likely as large: its room back to
    # the first size, or every header would carry up to SHMCOLL_SMALL_BYTES of nothing per local rank.
    agreed.room = max(FIRST_ROOM, min(cap, _widest(sends, range(size), shape))) if small else FIRST_ROOM
    if not len(bad) and verdict.longest and small:
        pieces = {}  # (source, local destination) -> bytes
        for l, source in enumerate(local):
            for k, d in enumerate(local):
                pieces[source, k] = rows[l, starts[l, d]:starts[l, d] + table[l, d]]
        for m in others:
            offset = 0
            for s in shape.nodes[m]:
                for k, d in enumerate(local):
                    pieces[s, k] = incoming[m][offset:offset + sends[s, d]]
                    offset += sends[s, d]
        for k in range(len(local)):
            received = np.concatenate([pieces[s, k] for s in range(size)])
            replies[k, _VERDICT * _INT64:_VERDICT * _INT64 + received.size] = received
        verdict = verdict._replace(done=1)
    replies[:, :_VERDICT * _INT64].view(np.int64)[:] = verdict


def _widest(sends: np.ndarray, senders, shape) -> int:
    """The most bytes one of ``senders`` (the group ranks of the rows of ``sends``) sends to one other node."""
    widest = 0
    for row, sender in zip(sends, senders):
        for m, ranks in enumerate(shape.nodes):
            if m != shape.where[sender][0]:
                widest = max(widest, int(row[ranks].sum()))
    return widest


def _header_bytes(ranks: int, size: int, room: int) -> int:
    """A leader's header for a node of ``ranks`` ranks: flag, size table, room for the inline blocks."""
    return _INT64 + ranks * 2 * size * _INT64 + ranks * room
