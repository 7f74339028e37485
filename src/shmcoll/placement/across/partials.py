"""Partial results combined between nodes: Gloo only moves them, the arena's kernels reduce them.

Every reduction across nodes meets here. The members of a link (the nodes' ranks
on a rail, or the leaders) each hold a *partial* (their node's reduction, from the
node stages); the members that need the result receive the others' partials and
combine them with the kernels every schedule calls, in member order (= node
order). So every rank that holds a result holds the same bits, every (op, dtype)
the kernels reduce is reduced between nodes as inside one (Gloo reduces no int16,
and no complex or PREMUL_SUM but through a real view and a factor applied
beforehand), and nothing depends on the order in which Gloo adds.

Two forms, which the plans choose between by size:

- one round: a member sends its whole partial to each member that needs the
  result (N - 1 messages each way, all at once): two members, or a small message;
- two rounds: a reduce-scatter (member m receives every member's m-th piece and
  combines them) and then the combined pieces to every member (all-reduce) or to
  one (reduce): each member sends 2 (N - 1) / N of the message, as a ring does,
  in two rounds instead of 2 (N - 1). Beyond ``EXCHANGE_NODES`` members the
  first round is Gloo's all_to_all and the all-reduce's second its all_gather.
"""
from __future__ import annotations

import torch

from shmcoll import _schedules, ops
from shmcoll.placement.across.network import EXCHANGE_NODES, Link, Pending


def combine(red: ops.Reduction, out: torch.Tensor, parts: torch.Tensor, scale: float = 1.0) -> None:
    """``out`` = parts[0] op parts[1] op ... (the rows of contiguous ``parts``, in member order), with
    ``red.across``'s op; ``scale`` applies PREMUL_SUM's factor where the parts are raw inputs."""
    op, _ = red.across
    if len(parts) == 1:
        out.copy_(parts[0])
        if scale != 1.0:
            out.mul_(scale)
        return
    _schedules.combine(red.kernel, out.data_ptr(), parts[0].data_ptr(), parts[1].data_ptr(), len(parts) - 1,
                    parts.stride(0), out.numel(), op, scale)


def allreduce(link: Link, part: torch.Tensor, red: ops.Reduction, one_round: bool) -> Pending:
    """``part`` (contiguous, 1-D): this member's partial -> the combination of every member's, on every member
    (before AVG's division), once the returned Pending is waited for."""
    members, me = len(link.ranks), link.position
    if one_round:
        return _whole(link, part, red, {m: part for m in range(members) if m != me})
    pieces, rows, first = _scatter_pieces(link, part)

    def gather_everywhere():
        combine(red, pieces[me], rows)
        if members > EXCHANGE_NODES:
            second = link.allgather(list(pieces), pieces[me])
        else:
            others = [m for m in range(members) if m != me]
            second = link.swap({m: pieces[me] for m in others}, {m: pieces[m] for m in others})
        return second.followed_by(lambda: _unpad(part, pieces))

    return first.followed_by(gather_everywhere)


def toward(link: Link, part: torch.Tensor, to: int, red: ops.Reduction, one_round: bool) -> Pending:
    """``part`` (contiguous, 1-D): this member's partial -> on member ``to``, the combination of every member's
    (before AVG's division); elsewhere scratch."""
    members, me = len(link.ranks), link.position
    others = [m for m in range(members) if m != to]
    if one_round:
        return _whole(link, part, red, {}) if me == to else link.send(part, to)
    pieces, rows, first = _scatter_pieces(link, part)

    def gather_on_root():
        combine(red, pieces[me], rows)
        if me != to:
            return link.send(pieces[me], to)
        return link.swap({}, {m: pieces[m] for m in others}).followed_by(lambda: _unpad(part, pieces))

    return first.followed_by(gather_on_root)


def _whole(link: Link, part: torch.Tensor, red: ops.Reduction, outgoing: dict) -> Pending:
    """The one round: ``part`` sent as ``outgoing`` says (member -> tensor), every other member's whole partial
    received, and ``part`` = their combination in member order once they are in."""
    members, me = len(link.ranks), link.position
    rows = torch.empty((members, part.numel()), dtype=part.dtype)
    pending = link.swap(outgoing, {m: rows[m] for m in range(members) if m != me})

    def combined():
        rows[me].copy_(part)
        combine(red, part, rows)

    return pending.followed_by(combined)


def _scatter_pieces(link: Link, part: torch.Tensor):
    """The first round of the two: ``part`` cut into one piece per member (equal, the last padded), and member m
    sent its piece; returns (this member's pieces, rows of every member's partial of our piece, the round)."""
    members, me, count = len(link.ranks), link.position, part.numel()
    size = -(-count // members)
    if size * members == count:
        padded = part
    else:
        padded = torch.zeros(size * members, dtype=part.dtype)
        padded[:count].copy_(part)
    pieces = padded.view(members, size)
    rows = torch.empty((members, size), dtype=part.dtype)
    if members > EXCHANGE_NODES:
        return pieces, rows, link.alltoall(rows.view(-1), padded, [size] * members, [size] * members)
    rows[me].copy_(pieces[me])
    others = [m for m in range(members) if m != me]
    return pieces, rows, link.swap({m: pieces[m] for m in others}, {m: rows[m] for m in others})


def _unpad(part: torch.Tensor, pieces: torch.Tensor) -> None:
    """The result, from the pieces' (padded) buffer into ``part`` where they are not ``part`` itself."""
    if pieces.data_ptr() != part.data_ptr():
        part.copy_(pieces.view(-1)[:part.numel()])
