"""The descriptor every collective stamps on its steps: what identifies it, packed into 64 bits.

Ranks compare descriptors at a collective's first step, so that ranks in different
collectives (kind, op, dtype, count, root) are caught and named; errors and logs
print them. Torch-free (the arena's mismatch check names both collectives): the op and
dtype codes are ``kernel_abi``'s tables'.
"""
from __future__ import annotations

from shmcoll import kernel_abi

# Collective kinds, for descriptors and messages.
BARRIER, ALLREDUCE, BROADCAST, ALLGATHER, REDUCE, GATHER, SCATTER, REDUCE_SCATTER, ALLTOALL = range(1, 10)
KIND_NAMES = {BARRIER: "barrier", ALLREDUCE: "all_reduce", BROADCAST: "broadcast", ALLGATHER: "all_gather",
              REDUCE: "reduce", GATHER: "gather", SCATTER: "scatter", REDUCE_SCATTER: "reduce_scatter",
              ALLTOALL: "all_to_all"}
_ROOTED = {"broadcast", "reduce", "gather", "scatter"}
_OP_NAME_BY_CODE = {o.kernel + 1: o.name for o in kernel_abi.REDUCE_OPS}  # 0: no op
_DTYPE_BY_CODE = {d.code: d.name for d in kernel_abi.DTYPE_TABLE}  # 0: a count in bytes

COUNT_SHIFT = 30  # the count is the descriptor's top field: descriptor(..., 0, ...) | count << COUNT_SHIFT
COUNT_MAX = (1 << 34) - 1  # the largest count that field holds whole (descriptor() keeps a larger one's low bits)
# More bytes than any message has (COUNT_MAX elements of the widest dtype are 2^38 bytes): the limit of what
# no message reaches, an int where C takes it.
BEYOND_ANY_MESSAGE = 1 << 62


def descriptor(kind: int, count: int = 0, dtype_code: int = 0, op_code: int = 0, root: int = 0) -> int:
    """Pack what identifies a collective into 64 bits: kind 6, op 4, dtype 5, root 15, count 34."""
    return (kind | op_code << 6 | dtype_code << 10 | (root & 0x7FFF) << 15
            | (count & COUNT_MAX) << COUNT_SHIFT)


def without_count(desc: int) -> int:
    """All that identifies a collective but its count (a fast path adds ``count << COUNT_SHIFT``)."""
    return desc & ((1 << COUNT_SHIFT) - 1)


def counts_elements(desc: int) -> bool:
    """Whether the count is of elements of a named dtype (else of bytes)."""
    return bool(desc >> 10 & 0x1F)


def _unpack(desc: int):
    """(kind code, op name or None, dtype name or None, root, count) of a descriptor."""
    return (desc & 0x3F, _OP_NAME_BY_CODE.get(desc >> 6 & 0xF), _DTYPE_BY_CODE.get(desc >> 10 & 0x1F),
            desc >> 15 & 0x7FFF, desc >> COUNT_SHIFT)


def fields(desc: int) -> tuple[int, dict]:
    """(kind code, what a profiler event of the collective carries: its name, op, dtype, root, message size)."""
    code, op, dtype, root, count = _unpack(desc)
    kind = KIND_NAMES.get(code, f"collective #{code}")
    what = {"Collective name": kind}
    if op:
        what["Reduce op"] = op
    if kind in _ROOTED:
        what["Root"] = root
    if kind not in ("barrier", "all_to_all"):
        what.update({"dtype": dtype, "In msg nelems": count} if dtype else {"In msg bytes": count})
    return code, what


def describe(desc: int) -> str:
    """Human text for a descriptor, e.g. 'all_reduce(sum, float32, 4096 elements)'."""
    code, op, dtype, root, count = _unpack(desc)
    kind = KIND_NAMES.get(code, f"collective #{code}")
    parts = [p for p in (op, dtype) if p]
    if kind in _ROOTED:
        parts.append(f"root {root}")
    if kind not in ("barrier", "all_to_all"):  # all_to_all: the sizes are per pair, exchanged in the collective
        parts.append(f"{count} {'elements' if dtype else 'bytes'}")
    return f"{kind}({', '.join(parts)})"
