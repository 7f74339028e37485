"""All-reduce: one-shot for small messages, chunked reduce-scatter + all-gather for large.

Both reduce the L contributions in rank order (row 0 first), so every rank, and
both algorithms, produce bitwise identical results.
"""
from shmcoll._copy import copy


def one_shot(arena, addr: int, count: int, itemsize: int, np_dtype, kernel, op: int, scale: float,
             desc: int) -> None:
    """Everyone publishes its whole input, then reduces all slots into its output."""
    me = arena.local_rank
    nbytes = count * itemsize
    step = arena.begin_write()
    buf = step & 1
    copy(arena.slot(buf, me), addr, nbytes)
    arena.post(step, desc)
    arena.wait_all(step)
    arena.check_same_collective(step, desc)
    # Reduce into our private scratch (cache-hot), then hand the result over.
    out, first, rest = arena.one_shot_views(buf, np_dtype, count)
    kernel(out, first, rest, op, scale)
    copy(addr, arena.scratch, nbytes)


def reduce_scatter_allgather(arena, addr: int, count: int, itemsize: int, np_dtype, kernel, op: int,
                             scale: float, desc: int, root: int | None = None) -> None:
    """Per chunk: publish it, reduce our 1/L share of it, publish that, gather the others' shares.

    With ``root``, only that rank gathers (a reduce); the others leave once their share is published.
    """
    me, size = arena.local_rank, arena.local_size
    per_chunk = arena.chunk_bytes // itemsize
    for start in range(0, count, per_chunk):
        n = min(per_chunk, count - start)
        chunk_addr = addr + start * itemsize
        lo, hi = me * n // size, (me + 1) * n // size

        step = arena.begin_write()
        buf = step & 1
        copy(arena.slot(buf, me), chunk_addr, n * itemsize)
        arena.post(step, desc)
        arena.wait_all(step)
        if start == 0:
            arena.check_same_collective(step, desc)
        rows = arena.rows(buf, np_dtype)
        # Our slot of the other buffer is ours to write: the next step is this collective's.
        kernel(arena.rows(buf ^ 1, np_dtype)[me, lo:hi], rows[0, lo:hi], rows[1:, lo:hi], op, scale)

        step = arena.begin_write()  # every peer reached the previous step: no wait
        arena.post(step, desc)
        if root is not None and me != root:
            continue
        arena.wait_all(step)
        for peer in range(size):
            plo, phi = peer * n // size, (peer + 1) * n // size
            copy(chunk_addr + plo * itemsize, arena.slot(buf ^ 1, peer) + plo * itemsize, (phi - plo) * itemsize)
