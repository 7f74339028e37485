"""Lazily negated and conjugated views (the neg and conj bits), and tensors at a stride of 2, in every collective
and in send/recv, synchronous and asynchronous, against local references (tests/test_views.py).

A neg-bit view's memory holds the negation of what torch shows (``torch._neg_view(m)`` shows -m; so does the
imaginary part of a conjugated complex tensor, ``c.conj().imag``); a conj-bit view's memory holds the
conjugate. Whatever reads a call's tensors must read what torch shows, and whatever it writes torch must show:
inputs, outputs and in-place tensors are made here as such views, of every dtype that has them, and every
result is compared, as torch shows it, with the reference computed from the values shown.
"""
from __future__ import annotations

import traceback

import torch
import torch.distributed as dist

from tests.references import assert_equal, make_input, reference_reduce

# Every dtype whose neg-bit views torch can resolve (bool's cannot: "neg_cpu" is not implemented for it), and
# the complex ones, which also have conj-bit views.
NEG_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
              torch.int64, torch.uint8, torch.complex64, torch.complex128)
CONJ_DTYPES = (torch.complex64, torch.complex128)
# Tensors at a stride of 2, of every itemsize: at most one element, torch calls them contiguous (and keeps the
# stride in their flat views, which a view as bytes refuses); more, they are not.
STRIDED_DTYPES = (torch.uint8, torch.int16, torch.bfloat16, torch.float32, torch.int64, torch.complex64)
STRIDED_COUNTS = (0, 1, 7)


def shown_as(kind: str, values: torch.Tensor) -> torch.Tensor:
    """A tensor torch shows as ``values`` whose memory holds other values (a neg-bit or conj-bit view), or holds
    them at a stride of 2 (``strided``)."""
    if kind == "neg":
        return torch._neg_view(-values)
    if kind == "strided":
        count = values.numel()
        memory = torch.full((max(2 * count - 1, 1),), GAP, dtype=values.dtype)
        return memory.as_strided((count,), (2,)).copy_(values)
    assert kind == "conj"
    return values.conj().resolve_conj().conj()


# What the memory between a strided tensor's elements holds, and must still hold after any call.
GAP = 99


def gaps_kept(tensor: torch.Tensor) -> bool:
    """Whether the memory between the elements of a tensor ``shown_as`` made strided still holds ``GAP``."""
    return bool((tensor._base[1::2] == GAP).all())


def blank(kind: str, like: torch.Tensor) -> torch.Tensor:
    """An output of ``kind`` (as ``shown_as`` makes it) to be written, showing garbage first."""
    return shown_as(kind, torch.full_like(like, 7))


def values(case: str, rank: int, dtype, count: int) -> torch.Tensor:
    """Rank ``rank``'s values for ``case``, exact under sums in any order (complex: two such real parts)."""
    if dtype.is_complex:
        real = torch.float64 if dtype == torch.complex128 else torch.float32
        parts = make_input(case, rank, real, 2 * count).view(count, 2)
        return torch.view_as_complex(parts.contiguous()).to(dtype)
    return make_input(case, rank, dtype, count)


def summed(inputs, dtype):
    """The reference sum of every rank's values (complex: of the real views)."""
    if dtype.is_complex:
        real = torch.float64 if dtype == torch.complex128 else torch.float32
        total = reference_reduce([torch.view_as_real(x).reshape(-1) for x in inputs], "sum", real)
        return torch.view_as_complex(total.view(-1, 2).contiguous()).to(dtype)
    return reference_reduce(inputs, "sum", dtype)


def every_view(cases, big: str):
    rank, world = dist.get_rank(), dist.get_world_size()
    root = world - 1
    counts = (1, 7, int(big))  # big: above one chunk of the job's SHMCOLL_CHUNK_BYTES

    def run(kind: str, dtype, count: int, name: str, async_op: bool):
        case = f"{kind}/{name}/{dtype}/n={count}/async={async_op}"
        mine = values(case, rank, dtype, count)
        everyone = [values(case, r, dtype, count) for r in range(world)]
        blocks = [values(f"{case}/blocks", r, dtype, count * world) for r in range(world)]
        work, check = None, []
        if name == "all_reduce":
            tensor = shown_as(kind, mine)
            work = dist.all_reduce(tensor, async_op=async_op)
            check.append((tensor, summed(everyone, dtype)))
        elif name == "all_reduce_max":
            tensor = shown_as(kind, mine)
            work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, async_op=async_op)
            check.append((tensor, torch.stack(everyone).amax(0)))
        elif name == "reduce":
            tensor = shown_as(kind, mine)
            work = dist.reduce(tensor, root, async_op=async_op)
            check.append((tensor, summed(everyone, dtype) if rank == root else mine))
        elif name == "broadcast":
            tensor = shown_as(kind, mine)
            work = dist.broadcast(tensor, root, async_op=async_op)
            check.append((tensor, everyone[root]))
        elif name == "all_gather":
            outputs = [blank(kind, mine) for _ in range(world)]
            work = dist.all_gather(outputs, shown_as(kind, mine), async_op=async_op)
            check.extend(zip(outputs, everyone))
        elif name == "all_gather_into_tensor":
            output = blank(kind, torch.cat(everyone))
            work = dist.all_gather_into_tensor(output, shown_as(kind, mine), async_op=async_op)
            check.append((output, torch.cat(everyone)))
        elif name == "reduce_scatter":
            output = blank(kind, mine)
            inputs = [shown_as(kind, block) for block in blocks[rank].chunk(world)]
            work = dist.reduce_scatter(output, inputs, async_op=async_op)
            check.append((output, summed(blocks, dtype)[rank * count:(rank + 1) * count]))
        elif name == "reduce_scatter_tensor":
            output = blank(kind, mine)
            work = dist.reduce_scatter_tensor(output, shown_as(kind, blocks[rank]), async_op=async_op)
            check.append((output, summed(blocks, dtype)[rank * count:(rank + 1) * count]))
        elif name == "gather":
            outputs = [blank(kind, mine) for _ in range(world)] if rank == root else None
            work = dist.gather(shown_as(kind, mine), outputs, root, async_op=async_op)
            if rank == root:
                check.extend(zip(outputs, everyone))
        elif name == "scatter":
            output = blank(kind, mine)
            parts = [shown_as(kind, x) for x in everyone] if rank == root else None
            work = dist.scatter(output, parts, root, async_op=async_op)
            check.append((output, everyone[rank]))
        elif name == "all_to_all":
            outputs = [blank(kind, mine) for _ in range(world)]
            inputs = [shown_as(kind, x) for x in blocks[rank].chunk(world)]
            work = dist.all_to_all(outputs, inputs, async_op=async_op)
            check.extend((out, blocks[r][rank * count:(rank + 1) * count]) for r, out in enumerate(outputs))
        elif name == "all_to_all_single":
            output = blank(kind, blocks[rank])
            work = dist.all_to_all_single(output, shown_as(kind, blocks[rank]), async_op=async_op)
            check.append((output, torch.cat([b[rank * count:(rank + 1) * count] for b in blocks])))
        elif name == "send_recv":  # pairs of ranks; an odd last rank sits out
            peer = rank ^ 1
            if peer < world:
                if rank % 2 == 0:
                    send = dist.isend if async_op else dist.send
                    work = send(shown_as(kind, mine), peer)
                else:
                    got = blank(kind, mine)
                    work = (dist.irecv if async_op else dist.recv)(got, peer)
                    check.append((got, everyone[peer]))
                work = work if async_op else None
        if async_op and work is not None:
            work.wait()
        for got, want in check:
            assert_equal(got.resolve_conj().resolve_neg(), want, case)
            assert kind != "strided" or gaps_kept(got), f"{case}: wrote between the elements of a strided output"

    def run_or_refused(kind: str, dtype, count: int, name: str, async_op: bool):
        """``run``, where torch's own wrapper may refuse the call before any backend sees it: many of them
        (all_reduce, broadcast, the all_gathers, the all_to_alls, scatter, isend and irecv) view a complex tensor
        as real, which a conj-bit view cannot be (every rank has one: all refuse alike, as on every backend)."""
        try:
            run(kind, dtype, count, name, async_op)
        except RuntimeError as error:
            where = traceback.extract_tb(error.__traceback__)[-1].filename
            if not (kind == "conj" and "view_as_real doesn't work on unresolved conjugated" in str(error)
                    and where.endswith("distributed_c10d.py")):
                raise

    names = ("all_reduce", "all_reduce_max", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
             "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all", "all_to_all_single",
             "send_recv")
    for kind, dtypes in (("neg", NEG_DTYPES), ("conj", CONJ_DTYPES), ("strided", STRIDED_DTYPES)):
        for dtype in dtypes:
            for name in names:
                if name == "all_reduce_max" and dtype.is_complex:
                    continue  # no order on complex numbers
                if name in ("send_recv",) and world == 1:
                    continue
                for count in counts if kind != "strided" else STRIDED_COUNTS:
                    for async_op in (False, True):
                        # twice: the second call of a plan takes the fast paths that the first admitted
                        for n in range(2):
                            cases.run(f"{kind}/{name}/{dtype}/n={count}/async={async_op}#{n}", run_or_refused, kind,
                                      dtype, count, name, async_op)
