"""The one table of dtypes and the one table of reduce ops, without importing Numba or torch.

Every other place derives what it needs from these two tables: ``ops`` adds each
dtype's torch dtype by name (``getattr(torch, name)``) and each op's ``ReduceOp``;
``kernels`` compiles each dtype's kernel family at its NumPy type; ``kernel_library``
links one entry point per dtype that has a kernel. The collectives need the codes,
the dtypes and which ops each dtype supports before any kernel is loaded (to check a
user's arguments), and on the fast start-up path the kernels come from a native
library, so Numba is never imported at all.

C entry point of each dtype's kernel (called by address, without the GIL, from
the Cython schedules in ``shmcoll._schedules``)::

    void entry(void *out, const void *first, const void *rows, int64 nrows,
               int64 row_stride, int64 n, int64 op, double scale)

``rows`` holds ``nrows`` rows of ``n`` elements, row r + 1 starting
``row_stride`` elements after row r; ``op`` is a ``kernel`` code of REDUCE_OPS;
element types and semantics are in the ``kernels`` docstring.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "FLOAT", "INTEGER", "BOOL",
           "DType", "DTYPE_TABLE", "DTYPE_BY_NAME", "DTYPES", "OpSpec", "REDUCE_OPS", "supports"]

# what a dtype's arithmetic is (DType.nature), which decides the ops its kernel has (OpSpec.natures)
FLOAT = "float"  # IEEE arithmetic (the 16-bit formats in float32, rounded once)
INTEGER = "integer"  # wraps modulo 2**bits; AVG is the sum divided after, toward zero (ops)
BOOL = "bool"  # logical or / and / xor


class DType(NamedTuple):
    name: str  # torch's name (torch.<name>), the kernel's, and what messages print
    code: int  # descriptor dtype code, 1..31 (5 bits; 0: a count in bytes), the same on every rank
    numpy: np.dtype | None  # element type of arena views and kernel arrays; None: no kernel
    nature: str | None  # FLOAT, INTEGER or BOOL; None: no kernel
    family: str | None  # the loop of ``kernels`` (kernels.FAMILIES) that reduces it; None: no kernel


# Adding a dtype is one row here (and, if no family fits, a loop in kernels.FAMILIES).
DTYPE_TABLE = tuple(DType(name, code, None if numpy is None else np.dtype(numpy), nature, family)
                    for name, code, numpy, nature, family in (
    # name            code  NumPy type  nature   kernel family
    ("float32",          1, np.float32, FLOAT,   "float"),
    ("float64",          2, np.float64, FLOAT,   "float"),
    ("float16",          3, np.uint16,  FLOAT,   "f16"),  # raw IEEE half bits
    ("bfloat16",         4, np.uint16,  FLOAT,   "bf16"),  # raw bits (NumPy has no bfloat16)
    ("int8",             5, np.int8,    INTEGER, "int"),
    ("int16",            6, np.int16,   INTEGER, "int"),
    ("int32",            7, np.int32,   INTEGER, "int"),
    ("int64",            8, np.int64,   INTEGER, "int"),
    ("uint8",            9, np.uint8,   INTEGER, "int"),
    ("bool",            10, np.bool_,   BOOL,    "bool"),  # NOT uint8
    # No kernel: data movement (broadcast, gather, ...) moves them as bytes, and their
    # descriptors still name them, so that ranks disagreeing on the dtype are caught.
    # (A complex tensor is reduced as its real view: ops.)
    ("complex64",       11, None,       None,    None),
    ("complex128",      12, None,       None,    None),
    ("complex32",       13, None,       None,    None),
    ("uint16",          14, None,       None,    None),
    ("uint32",          15, None,       None,    None),
    ("uint64",          16, None,       None,    None),
    ("float8_e4m3fn",   17, None,       None,    None),
    ("float8_e5m2",     18, None,       None,    None),
    ("float8_e4m3fnuz", 19, None,       None,    None),
    ("float8_e5m2fnuz", 20, None,       None,    None),
    ("qint8",           21, None,       None,    None),
    ("quint8",          22, None,       None,    None),
    ("qint32",          23, None,       None,    None),
))
DTYPE_BY_NAME = {d.name: d for d in DTYPE_TABLE}
DTYPES = tuple(d.name for d in DTYPE_TABLE if d.family is not None)  # the dtypes that have a kernel


class OpSpec(NamedTuple):
    name: str  # torch's name in lower case (ReduceOp.RedOpType.<NAME>); what messages print
    kernel: int  # the C entry point's ``op``; descriptors name the op as kernel + 1 (0: none)
    natures: frozenset  # the DType natures whose kernels implement it
    average: bool  # the kernel divides the sum by its ``scale`` (the number of contributions)
    complex: bool  # defined for complex tensors, reduced as their real view (a linear op)


_ANY, _BITWISE, _FLOATS = frozenset((FLOAT, INTEGER, BOOL)), frozenset((INTEGER, BOOL)), frozenset((FLOAT,))

REDUCE_OPS = tuple(OpSpec(*row) for row in (
    # name     kernel  natures   average complex
    ("sum",      0,    _ANY,     False,  True),
    ("product",  1,    _ANY,     False,  False),
    ("min",      2,    _ANY,     False,  False),
    ("max",      3,    _ANY,     False,  False),
    ("band",     4,    _BITWISE, False,  False),
    ("bor",      5,    _BITWISE, False,  False),
    ("bxor",     6,    _BITWISE, False,  False),
    # AVG: the SUM, divided by ``scale`` (the number of contributions) before the one
    # rounding. Division, not a multiply by 1/scale, so the result is the correctly
    # rounded mean, as Gloo computes it. Between nodes a SUM, divided at the end.
    ("avg",      7,    _FLOATS,  True,   True),
))
_BY_KERNEL = {op.kernel: op for op in REDUCE_OPS}

# the kernel op codes by name, for the kernels and the schedules' callers
_KERNEL_CODE = {op.name: op.kernel for op in REDUCE_OPS}
SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR, AVG = (
    _KERNEL_CODE[name] for name in ("sum", "product", "min", "max", "band", "bor", "bxor", "avg"))


def supports(dtype: str, op: int) -> bool:
    """True if the kernel of dtype implements op (bitwise ops: integer/bool only; AVG: floats only)."""
    d, o = DTYPE_BY_NAME.get(dtype), _BY_KERNEL.get(op)
    return d is not None and o is not None and d.family is not None and d.nature in o.natures
