"""What the sweep measures at one point, and how it knows the result is right.

A point is one (op, dtype, size).  ``OpCase`` holds what every backend runs there: the
buffers, the torch.distributed call, and the result each rank should hold, computed locally
in float64 from deterministic inputs.  ``check_point`` runs the call once per backend on
those inputs and compares every result with that expectation and with the reference
backend's (gloo's).  shmcoll_bench.sweep (torch backends) and shmcoll_bench.mpi (the same
points on MPI) share these, so both sweeps measure identical buffers and check them alike.

``counts_for`` turns a size into element counts by the nccl-tests convention that
shmcoll_bench.sweep describes, and ``BUSBW_FACTOR`` holds that convention's busbw factors.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from shmcoll_bench.report import dtype_name

ALL_OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast")
# The share of a rank's bytes that crosses the "bus" (nccl-tests): what makes busbw
# comparable across ops and world sizes.
BUSBW_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather_into_tensor": lambda n: (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}

# torch >= 2.13 deprecates all_gather_into_tensor / reduce_scatter_tensor in favour of the
# *_single names (same semantics, same backend entry points: _allgather_base /
# _reduce_scatter_base); call the new names directly when present to skip the warning shim.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
# and funcol's all_gather_tensor / reduce_scatter_tensor alike (whose FutureWarning would fill bench_async's output)
FUNCOL_ALL_GATHER = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
FUNCOL_REDUCE_SCATTER = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor


class Mismatch(Exception):
    """A wrong result that every rank agreed on."""


def counts_for(op: str, nbytes: int, elsize: int, world: int) -> int:
    """Element count of the op's big buffer for a nominal size (nccl-tests 'size')."""
    count = max(1, nbytes // elsize)
    if op in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        count = max(world, count - count % world)
    return count


def point_salt(index: int) -> int:
    """The inputs of the index-th point: they differ from one point to the next, so that a
    result left over from an earlier point cannot pass for this one's."""
    return (index * 7 + 3) % 129


def make_input(rank: int, count: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    """Deterministic rank-dependent data: k/64 with k in [-64, 64] (exact in bf16/fp16)."""
    i = torch.arange(count, dtype=torch.int64)
    k = (i * 31 + rank * 17 + salt) % 129 - 64
    if dtype.is_floating_point or dtype.is_complex:
        return (k.to(torch.float32) / 64).to(dtype)
    return k.to(dtype)


class OpCase:
    """Buffers and the callable for one (op, dtype, count) on one group."""

    def __init__(self, op: str, count: int, dtype: torch.dtype, world: int, rank: int):
        self.op, self.count, self.dtype, self.world, self.rank = op, count, dtype, world, rank
        self.chunk = count // world if op in ("all_gather_into_tensor", "reduce_scatter_tensor") else count

    def alloc(self, fill_from: torch.Tensor | None = None):
        """Returns (inp, out); out is None for in-place ops.  Filled with ones unless fill_from.

        Not zeros: on the VM these numbers come from, copying zeros runs about 1.5x
        faster than copying anything else (all-gather 16 MiB: 1.3 ms against
        1.9 ms, the same tensors filled with ones), which flattered every backend.
        Summing ones repeatedly overflows to inf, which costs the same as any value.
        """
        op, dt = self.op, self.dtype
        if op in ("all_reduce", "broadcast"):
            inp = torch.empty(self.count, dtype=dt).fill_(1)
            out = None
        elif op == "all_gather_into_tensor":
            inp = torch.empty(self.chunk, dtype=dt).fill_(1)
            out = torch.empty(self.count, dtype=dt).fill_(1)
        else:  # reduce_scatter_tensor
            inp = torch.empty(self.count, dtype=dt).fill_(1)
            out = torch.empty(self.chunk, dtype=dt).fill_(1)
        if fill_from is not None:
            inp.copy_(fill_from)
        return inp, out

    def fn(self, group, inp, out):
        op = self.op
        if op == "all_reduce":
            return lambda: dist.all_reduce(inp, op=dist.ReduceOp.SUM, group=group)
        if op == "broadcast":
            return lambda: dist.broadcast(inp, src=0, group=group)
        if op == "all_gather_into_tensor":
            return lambda: ALL_GATHER(out, inp, group=group)
        return lambda: REDUCE_SCATTER(out, inp, op=dist.ReduceOp.SUM, group=group)

    def input_len(self) -> int:
        return self.chunk if self.op == "all_gather_into_tensor" else self.count

    def expected(self, salt: int) -> torch.Tensor:
        """The result this rank should hold, in float64 (computed locally)."""
        n, L = self.world, self.input_len()
        wide = _wide(self.dtype)
        if self.op == "broadcast":
            return make_input(0, L, self.dtype, salt).to(wide)
        if self.op == "all_gather_into_tensor":
            return torch.cat([make_input(r, L, self.dtype, salt).to(wide) for r in range(n)])
        acc = torch.zeros(L, dtype=wide)
        for r in range(n):
            acc += make_input(r, L, self.dtype, salt).to(wide)
        if self.op == "reduce_scatter_tensor":
            acc = acc[self.rank * self.chunk:(self.rank + 1) * self.chunk]
        return acc


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype.is_complex else torch.float64


def tolerance(dtype: torch.dtype, world: int):
    """(atol, rtol) for inputs bounded by 1 in magnitude: bf16-level, grows with #summands."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return 0.0, 0.0
    eps = 2.0 ** -8  # half a bf16 ulp at 1.0
    return world * world * eps, 2 * eps


def compare(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float):
    """Returns None if close, else a short description of the worst difference."""
    g = got.to(want.dtype)
    if g.shape != want.shape:
        return f"shape {tuple(g.shape)} != expected {tuple(want.shape)}"
    diff = (g - want).abs()
    bad = ~(diff <= atol + rtol * want.abs())  # also catches NaN
    if not bool(bad.any()):
        return None
    idx = int(bad.nonzero()[0, 0])
    return (f"{int(bad.sum())}/{bad.numel()} elements differ, max |diff| "
            f"{float(diff.nan_to_num(float('inf')).max()):.4g}; first at [{idx}]: "
            f"got {g[idx].item()!s:.12}, want {want[idx].item()!s:.12}")


def check_point(case: OpCase, labels, groups, ctrl, ref_idx, salt, usable, args):
    """Runs the op once per usable backend on identical inputs; compares with the expected
    value and with the reference backend.  Returns per-backend error strings (None = ok) for
    backends that raised; raises Mismatch on a wrong result (agreed by all ranks)."""
    rank = case.rank
    nb = len(labels)
    src = make_input(rank, case.input_len(), case.dtype, salt)
    results, errors, inputs = [None] * nb, [None] * nb, [None] * nb
    for b in range(nb):
        if not usable[b]:
            continue
        inp, out = case.alloc(fill_from=src)
        try:
            case.fn(groups[b], inp, out)()
            results[b] = out if out is not None else inp
            inputs[b] = inp if out is not None else None
        except Exception as e:  # e.g. dtype unsupported by this backend
            errors[b] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
    failed = ctrl.max([1.0 if errors[b] else 0.0 for b in range(nb)])
    raised = [bool(f) and usable[b] for b, f in enumerate(failed)]
    if args.no_check:
        return raised, errors
    want = case.expected(salt)
    atol, rtol = tolerance(case.dtype, case.world)
    bad = [0.0] * (2 * nb)
    msgs = []
    ref = results[ref_idx] if usable[ref_idx] and not raised[ref_idx] else None
    for b in range(nb):
        if not usable[b] or raised[b]:
            continue
        d = compare(results[b], want, atol, rtol)
        if d:
            bad[b] = 1.0
            msgs.append(f"{labels[b]} vs expected: {d}")
        if inputs[b] is not None and not torch.equal(inputs[b], src):
            bad[b] = 1.0
            msgs.append(f"{labels[b]} modified its (out-of-place) input tensor")
        if ref is not None and b != ref_idx:
            d = compare(results[b], ref.to(want.dtype), atol, rtol)
            if d:
                bad[nb + b] = 1.0
                msgs.append(f"{labels[b]} vs {labels[ref_idx]}: {d}")
    agreed = ctrl.max(bad)
    if any(agreed):
        where = f"{case.op} {dtype_name(case.dtype)} {case.count * case.dtype.itemsize} bytes"
        for m in msgs:
            print(f"MISMATCH (rank {rank}) {where}: {m}", file=sys.stderr, flush=True)
        culprits = sorted({labels[b % nb] for b, f in enumerate(agreed) if f})
        raise Mismatch(
            f"correctness check failed for {where} (atol {atol:g}, rtol {rtol:g}); "
            f"backend(s) {', '.join(culprits)} disagree with the expected result"
            + (f" / with {labels[ref_idx]}" if any(agreed[nb:]) else "")
            + " — see MISMATCH lines on stderr")
    return raised, errors
