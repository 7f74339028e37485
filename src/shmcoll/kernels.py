"""Elementwise reduction kernels for shmcoll collectives.

Pure array code (NumPy + numba): no torch, no shared-memory knowledge. The
LLVM-level pieces the loops are written with are ``kernel_intrinsics``; which
dtypes there are, their NumPy types and families, and the op codes are
``kernel_abi``'s tables.

``reducer(dtype)(out, first, rows, op, scale)`` computes, for every index i::

    out[i] = op(first[i], rows[0, i], rows[1, i], ..., rows[k-1, i])

and, for ``op == SUM`` on floating dtypes only, multiplies the result by
``scale`` when ``scale != 1.0`` (AVG, PREMUL_SUM) before storing it.

Arrays the caller must pass (exactly the NumPy dtype of the dtype's row in
``kernel_abi.DTYPE_TABLE``, ``DType.numpy``: the 16-bit floats as uint16 raw
bits, ``t.view(torch.uint16).numpy()`` of a torch tensor; bool as ``bool_``,
NOT uint8; every other dtype its own, ``t.numpy()``; ``out`` writeable,
``first`` and ``rows`` may be read-only; all with NumPy's ``aligned`` flag):

* ``out`` and ``first``: 1-D C-contiguous arrays of n elements.
* ``rows``: 2-D array of shape (k, n), k >= 0; each row must be contiguous
  (``rows.strides[1] == itemsize``) but the row stride is arbitrary, e.g.
  ``big[:, a:a + n]``.  C-contiguous 2-D arrays are accepted without a new
  compilation (they convert to the compiled layout-'A' signature).
* ``op``: Python int (one of the op codes below); ``scale``: Python float
  (pass 1.0 when not scaling).
* ``out`` may be the same memory as ``first`` or as one of the rows, as long
  as the aliasing is index-for-index (same address for the same i).  Inputs
  are combined block by block into an on-stack float accumulator and only
  then stored, so that is safe, and every loop vectorises in every aliasing
  case (a plain ``out[i] = a[i] + b[i]`` loop gets LLVM runtime alias checks
  that send in-place calls to the scalar loop, measured 2x slower).  A plain
  SUM of up to three rows (one for bfloat16) into an output that is none of
  its inputs, which is what most collectives do, runs as such a one-pass loop
  instead: without the accumulator it is 10-25% faster (float16 1.6x); so
  does a SUM of one row into an output that is one of the two inputs (a
  loop over the output and the other input only: no alias check).
* Any wrong array type, dimension count or layout (non-contiguous 1-D, wrong
  dtype such as float16 passed as numpy float16 instead of uint16) raises
  ``TypeError`` from the dispatcher ("No matching definition").

Semantics per kernel family (``DType.family``; one loop of ``FAMILIES`` each):

* "float" (float32, float64): arithmetic in the array type.  MIN/MAX
  propagate NaN like ``torch.minimum``/``torch.maximum``.  SUM scale:
  ``acc * T(scale)`` in the array type (scale rounded to float32 for float32).
* "f16", "bf16" (float16, bfloat16): every input is widened to float32, all
  k+1 inputs are combined in float32 in the order first, rows[0], rows[1],
  ..., multiplied by ``float32(scale)`` if SUM and scale != 1.0, and rounded
  once to the 16-bit format (round to nearest even; inf stays inf, overflow
  becomes inf, NaN stays NaN), by ``kernel_intrinsics`` (float16 with F16C
  on x86-64, so the CPU needs F16C).  bfloat16 NaN results are stored as
  0x7FC0 (torch may produce other NaN bit patterns, e.g. 0xFFFF); float16
  NaNs are quiet NaNs.
* "int" (int8..int64, uint8): integer arithmetic wrapping modulo 2**bits
  (like torch); ``scale`` is ignored.
* "bool": SUM = MAX = BOR = logical or, PRODUCT = MIN = BAND = logical and,
  BXOR = logical xor.  Any non-zero byte reads as True; the output bytes are
  always 0 or 1.  ``scale`` is ignored.

An op that ``supports(dtype, op)`` rejects, mismatched lengths or a row
stride that is not contiguous raise ``ValueError`` from inside the kernel.

``reducer(dtype)`` compiles a dtype's kernel as an ``@njit(nogil=True,
cache=True)`` dispatcher with one explicit signature, lazily; after that it
never compiles again (compilation is disabled on it).  The collectives do not
use it: the unit tests and ``bench/bench_kernels.py`` call kernels with arrays.

Collectives call C entry points of the same kernels instead. ``kernel_library``
compiles them (``compile_entry``) into one native library that later processes
load without importing Numba (~1 ms instead of ~0.5 s); ``entry_point()`` here
is its fallback, Numba's JIT with its on-disk cache (10 compilations, ~9 s
cold on a 2-core EPYC).  That cache is numba's:
``NUMBA_CACHE_DIR`` if set, else ``shmcoll/__pycache__/`` next to this file if
writeable, else ``~/.cache/numba``-style user-wide directories, keyed by this
file's mtime/size, the Python version and the host CPU name/features, and
(``_SOURCES``) by the contents of ``kernel_intrinsics.py`` and ``kernel_abi.py``.
"""

import hashlib
import threading

import numpy as np
from numba import carray, cfunc, from_dtype, njit, types
from numba.extending import register_jitable

from shmcoll import kernel_abi, kernel_intrinsics
# op codes, dtypes and supports() live where code that must not import Numba finds them
from shmcoll.kernel_abi import AVG, BAND, BOR, BXOR, DTYPE_BY_NAME, DTYPES, MAX, MIN, PRODUCT, SUM, supports
from shmcoll.kernel_intrinsics import (BLOCK, as_elem, bf2f, bf_hi, bf_lo, bf_pack, f2bf, f2h, fmax, fmin, h2f,
                                       imax, imin, ld_pair, ptr, row_ptr, st_pair, stack_f32, stack_like)

__all__ = [
    "SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG",
    "DTYPES", "FAMILIES", "compile_entry", "entry_point", "reducer", "supports",
]


# ---------------------------------------------------------------------------
# kernels: one Python function per family, compiled once per dtype, with the
# op dispatched at run time outside all loops.
#
# Structure (all families): for each block of BLOCK elements, pass 1 reads
# first (and, for SUM, up to 3 rows at once) into the on-stack accumulator t;
# then each remaining row is folded into t; the last pass stores t (scaled if
# needed) into out.  Every loop either only reads the inputs and writes t, or
# only reads t and writes out, so LLVM vectorises all of them without runtime
# alias checks whatever out aliases (alias checks would send in-place calls
# to the scalar loop).
# ---------------------------------------------------------------------------

@njit(inline="always")
def _check(out, first, rows):
    n = first.shape[0]
    if out.shape[0] != n or rows.shape[1] != n:
        raise ValueError("shmcoll.kernels: out, first and rows lengths differ")
    if rows.shape[0] > 0 and n > 1 and rows.strides[1] != rows.itemsize:
        raise ValueError("shmcoll.kernels: rows must be contiguous per row")
    return n


OUT_IS_FIRST, OUT_IS_ROW = 1, 2  # _in_place


@register_jitable
def _separate(out, first, rows):
    """``out`` is not ``first`` nor any row (the case the one-pass SUM loops are fast for)."""
    a = out.ctypes.data
    if a == first.ctypes.data:
        return False
    for r in range(rows.shape[0]):
        if a == rows.ctypes.data + r * rows.strides[0]:
            return False
    return True


@register_jitable
def _in_place(out, first, rows):
    """For one row: OUT_IS_FIRST or OUT_IS_ROW where ``out`` is that input (and not the other), else 0. A loop
    over ``out`` and the other input only vectorises where out[i] = first[i] + row[i] would meet LLVM's alias
    check (a two-rank one-shot reduces into the caller's tensor, which is first on rank 0 and the row on rank 1;
    first still comes first)."""
    a, f, r = out.ctypes.data, first.ctypes.data, rows.ctypes.data
    if a == f and a != r:
        return OUT_IS_FIRST
    if a == r and a != f:
        return OUT_IS_ROW
    return 0


@register_jitable
def _reduce_float(out, first, rows, op, scale):
    n = _check(out, first, rows)
    divide = op == AVG
    if divide:
        op = SUM
    if op < SUM or op > MAX:
        raise ValueError("shmcoll.kernels: unsupported op for a float dtype")
    k = rows.shape[0]
    po = ptr(out)
    pf = ptr(first)
    t = stack_like(pf)
    s = as_elem(scale, pf)
    do_scale = op == SUM and scale != 1.0
    done = 0
    aliased = _in_place(out, first, rows)  # read for one row only
    # A plain SUM of up to 3 rows (2-4 ranks) into a separate output, in one pass without the
    # accumulator: 10-25% faster (float16: 1.6x). An output that is also an input takes the
    # in-place loop below (one row, _in_place) or the accumulator loops: LLVM's runtime alias
    # check would send this one to its scalar fallback (up to 7x slower).
    if op == SUM and not divide and not do_scale and 1 <= k <= 3 and _separate(out, first, rows):
        p0 = row_ptr(rows, 0)
        if k == 1:
            for i in range(n):
                po[i] = pf[i] + p0[i]
        elif k == 2:
            p1 = row_ptr(rows, 1)
            for i in range(n):
                po[i] = (pf[i] + p0[i]) + p1[i]
        else:
            p1 = row_ptr(rows, 1)
            p2 = row_ptr(rows, 2)
            for i in range(n):
                po[i] = ((pf[i] + p0[i]) + p1[i]) + p2[i]
        done = n
    elif op == SUM and not divide and not do_scale and k == 1 and aliased:
        p0 = row_ptr(rows, 0)
        if aliased == OUT_IS_FIRST:
            for i in range(n):
                po[i] = po[i] + p0[i]
        else:
            for i in range(n):
                po[i] = pf[i] + po[i]
        done = n
    for i0 in range(done, n, BLOCK):
        m = min(BLOCK, n - i0)
        r0 = 0
        if op == SUM and k > 0:
            # fused first pass for the common small row counts
            p0 = row_ptr(rows, 0)
            if k == 1:
                for j in range(m):
                    t[j] = pf[i0 + j] + p0[i0 + j]
                r0 = 1
            elif k == 2:
                p1 = row_ptr(rows, 1)
                for j in range(m):
                    t[j] = (pf[i0 + j] + p0[i0 + j]) + p1[i0 + j]
                r0 = 2
            else:
                p1 = row_ptr(rows, 1)
                p2 = row_ptr(rows, 2)
                for j in range(m):
                    t[j] = ((pf[i0 + j] + p0[i0 + j]) + p1[i0 + j]) + p2[i0 + j]
                r0 = 3
        else:
            for j in range(m):
                t[j] = pf[i0 + j]
        for r in range(r0, k):
            pr = row_ptr(rows, r)
            if op == SUM:
                for j in range(m):
                    t[j] = t[j] + pr[i0 + j]
            elif op == PRODUCT:
                for j in range(m):
                    t[j] = t[j] * pr[i0 + j]
            elif op == MIN:
                for j in range(m):
                    t[j] = fmin(t[j], pr[i0 + j])
            else:
                for j in range(m):
                    t[j] = fmax(t[j], pr[i0 + j])
        if divide:
            for j in range(m):
                po[i0 + j] = t[j] / s
        elif do_scale:
            for j in range(m):
                po[i0 + j] = t[j] * s
        else:
            for j in range(m):
                po[i0 + j] = t[j]


@register_jitable
def _reduce_f16(out, first, rows, op, scale):
    # identical to _reduce_float, with every input widened by h2f into the
    # float32 accumulator and the result rounded once by f2h
    n = _check(out, first, rows)
    divide = op == AVG
    if divide:
        op = SUM
    if op < SUM or op > MAX:
        raise ValueError("shmcoll.kernels: unsupported op for a float dtype")
    k = rows.shape[0]
    po = ptr(out)
    pf = ptr(first)
    t = stack_f32()
    s = np.float32(scale)
    do_scale = op == SUM and scale != 1.0
    done = 0
    aliased = _in_place(out, first, rows)  # read for one row only
    # one pass for a plain SUM into a separate output, as in _reduce_float
    if op == SUM and not divide and not do_scale and 1 <= k <= 3 and _separate(out, first, rows):
        p0 = row_ptr(rows, 0)
        if k == 1:
            for i in range(n):
                po[i] = f2h(h2f(pf[i]) + h2f(p0[i]))
        elif k == 2:
            p1 = row_ptr(rows, 1)
            for i in range(n):
                po[i] = f2h((h2f(pf[i]) + h2f(p0[i])) + h2f(p1[i]))
        else:
            p1 = row_ptr(rows, 1)
            p2 = row_ptr(rows, 2)
            for i in range(n):
                po[i] = f2h(((h2f(pf[i]) + h2f(p0[i])) + h2f(p1[i])) + h2f(p2[i]))
        done = n
    elif op == SUM and not divide and not do_scale and k == 1 and aliased:
        p0 = row_ptr(rows, 0)
        if aliased == OUT_IS_FIRST:
            for i in range(n):
                po[i] = f2h(h2f(po[i]) + h2f(p0[i]))
        else:
            for i in range(n):
                po[i] = f2h(h2f(pf[i]) + h2f(po[i]))
        done = n
    for i0 in range(done, n, BLOCK):
        m = min(BLOCK, n - i0)
        r0 = 0
        if op == SUM and k > 0:
            p0 = row_ptr(rows, 0)
            if k == 1:
                for j in range(m):
                    t[j] = h2f(pf[i0 + j]) + h2f(p0[i0 + j])
                r0 = 1
            elif k == 2:
                p1 = row_ptr(rows, 1)
                for j in range(m):
                    t[j] = ((h2f(pf[i0 + j]) + h2f(p0[i0 + j]))
                            + h2f(p1[i0 + j]))
                r0 = 2
            else:
                p1 = row_ptr(rows, 1)
                p2 = row_ptr(rows, 2)
                for j in range(m):
                    t[j] = (((h2f(pf[i0 + j]) + h2f(p0[i0 + j]))
                             + h2f(p1[i0 + j])) + h2f(p2[i0 + j]))
                r0 = 3
        else:
            for j in range(m):
                t[j] = h2f(pf[i0 + j])
        for r in range(r0, k):
            pr = row_ptr(rows, r)
            if op == SUM:
                for j in range(m):
                    t[j] = t[j] + h2f(pr[i0 + j])
            elif op == PRODUCT:
                for j in range(m):
                    t[j] = t[j] * h2f(pr[i0 + j])
            elif op == MIN:
                for j in range(m):
                    t[j] = fmin(t[j], h2f(pr[i0 + j]))
            else:
                for j in range(m):
                    t[j] = fmax(t[j], h2f(pr[i0 + j]))
        if divide:
            for j in range(m):
                po[i0 + j] = f2h(t[j] / s)
        elif do_scale:
            for j in range(m):
                po[i0 + j] = f2h(t[j] * s)
        else:
            for j in range(m):
                po[i0 + j] = f2h(t[j])


@register_jitable
def _reduce_bf16(out, first, rows, op, scale):
    # Like _reduce_f16, but the elements are processed in pairs (one uint32
    # word each): even elements accumulate in te, odd ones in to, so that
    # widening and rounding need no shuffles.  An odd last element is done
    # on its own at the end.
    n = _check(out, first, rows)
    divide = op == AVG
    if divide:
        op = SUM
    if op < SUM or op > MAX:
        raise ValueError("shmcoll.kernels: unsupported op for a float dtype")
    k = rows.shape[0]
    po = ptr(out)
    pf = ptr(first)
    half = BLOCK // 2
    te = stack_f32()  # two separate buffers, so that LLVM sees no
    to = stack_f32()  # possible overlap between te[j] and to[j]
    s = np.float32(scale)
    do_scale = op == SUM and scale != 1.0
    npairs = n // 2
    done = 0
    aliased = _in_place(out, first, rows)  # read for one row only
    # one pass for two ranks' SUM into a separate output, as in _reduce_float (with three or
    # more rows the accumulator loops below measured 5-8% faster for bfloat16)
    if op == SUM and not divide and not do_scale and k == 1 and _separate(out, first, rows):
        q0 = row_ptr(rows, 0)
        for p in range(npairs):
            a = ld_pair(pf, p)
            b = ld_pair(q0, p)
            st_pair(po, p, bf_pack(bf_lo(a) + bf_lo(b), bf_hi(a) + bf_hi(b)))
        done = npairs
    elif op == SUM and not divide and not do_scale and k == 1 and aliased:
        q0 = row_ptr(rows, 0)
        if aliased == OUT_IS_FIRST:
            for p in range(npairs):
                a = ld_pair(po, p)
                b = ld_pair(q0, p)
                st_pair(po, p, bf_pack(bf_lo(a) + bf_lo(b), bf_hi(a) + bf_hi(b)))
        else:
            for p in range(npairs):
                a = ld_pair(pf, p)
                b = ld_pair(po, p)
                st_pair(po, p, bf_pack(bf_lo(a) + bf_lo(b), bf_hi(a) + bf_hi(b)))
        done = npairs
    for p0 in range(done, npairs, half):
        m = min(half, npairs - p0)
        r0 = 0
        if op == SUM and k > 0:
            q0 = row_ptr(rows, 0)
            if k == 1:
                for j in range(m):
                    a = ld_pair(pf, p0 + j)
                    b = ld_pair(q0, p0 + j)
                    te[j] = bf_lo(a) + bf_lo(b)
                    to[j] = bf_hi(a) + bf_hi(b)
                r0 = 1
            elif k == 2:
                q1 = row_ptr(rows, 1)
                for j in range(m):
                    a = ld_pair(pf, p0 + j)
                    b = ld_pair(q0, p0 + j)
                    c = ld_pair(q1, p0 + j)
                    te[j] = (bf_lo(a) + bf_lo(b)) + bf_lo(c)
                    to[j] = (bf_hi(a) + bf_hi(b)) + bf_hi(c)
                r0 = 2
            else:
                q1 = row_ptr(rows, 1)
                q2 = row_ptr(rows, 2)
                for j in range(m):
                    a = ld_pair(pf, p0 + j)
                    b = ld_pair(q0, p0 + j)
                    c = ld_pair(q1, p0 + j)
                    d = ld_pair(q2, p0 + j)
                    te[j] = ((bf_lo(a) + bf_lo(b)) + bf_lo(c)) + bf_lo(d)
                    to[j] = ((bf_hi(a) + bf_hi(b)) + bf_hi(c)) + bf_hi(d)
                r0 = 3
        else:
            for j in range(m):
                a = ld_pair(pf, p0 + j)
                te[j] = bf_lo(a)
                to[j] = bf_hi(a)
        for r in range(r0, k):
            q = row_ptr(rows, r)
            if op == SUM:
                for j in range(m):
                    b = ld_pair(q, p0 + j)
                    te[j] = te[j] + bf_lo(b)
                    to[j] = to[j] + bf_hi(b)
            elif op == PRODUCT:
                for j in range(m):
                    b = ld_pair(q, p0 + j)
                    te[j] = te[j] * bf_lo(b)
                    to[j] = to[j] * bf_hi(b)
            elif op == MIN:
                for j in range(m):
                    b = ld_pair(q, p0 + j)
                    te[j] = fmin(te[j], bf_lo(b))
                    to[j] = fmin(to[j], bf_hi(b))
            else:
                for j in range(m):
                    b = ld_pair(q, p0 + j)
                    te[j] = fmax(te[j], bf_lo(b))
                    to[j] = fmax(to[j], bf_hi(b))
        if divide:
            for j in range(m):
                st_pair(po, p0 + j, bf_pack(te[j] / s, to[j] / s))
        elif do_scale:
            for j in range(m):
                st_pair(po, p0 + j, bf_pack(te[j] * s, to[j] * s))
        else:
            for j in range(m):
                st_pair(po, p0 + j, bf_pack(te[j], to[j]))
    if n % 2 == 1:
        i = n - 1
        x = bf2f(pf[i])
        for r in range(k):
            y = bf2f(row_ptr(rows, r)[i])
            if op == SUM:
                x = x + y
            elif op == PRODUCT:
                x = x * y
            elif op == MIN:
                x = fmin(x, y)
            else:
                x = fmax(x, y)
        if divide:
            x = x / s
        elif do_scale:
            x = x * s
        po[i] = f2bf(x)


@register_jitable
def _reduce_int(out, first, rows, op, scale):
    # integer arithmetic wraps (intermediates are truncated to the element
    # type on every store); scale is ignored.
    n = _check(out, first, rows)
    if op < SUM or op > BXOR:
        raise ValueError("shmcoll.kernels: unknown op")
    k = rows.shape[0]
    po = ptr(out)
    pf = ptr(first)
    t = stack_like(pf)
    for i0 in range(0, n, BLOCK):
        m = min(BLOCK, n - i0)
        r0 = 0
        if op == SUM and k > 0:
            p0 = row_ptr(rows, 0)
            for j in range(m):
                t[j] = pf[i0 + j] + p0[i0 + j]
            r0 = 1
        else:
            for j in range(m):
                t[j] = pf[i0 + j]
        for r in range(r0, k):
            pr = row_ptr(rows, r)
            if op == SUM:
                for j in range(m):
                    t[j] = t[j] + pr[i0 + j]
            elif op == PRODUCT:
                for j in range(m):
                    t[j] = t[j] * pr[i0 + j]
            elif op == MIN:
                for j in range(m):
                    t[j] = imin(t[j], pr[i0 + j])
            elif op == MAX:
                for j in range(m):
                    t[j] = imax(t[j], pr[i0 + j])
            elif op == BAND:
                for j in range(m):
                    t[j] = t[j] & pr[i0 + j]
            elif op == BOR:
                for j in range(m):
                    t[j] = t[j] | pr[i0 + j]
            else:
                for j in range(m):
                    t[j] = t[j] ^ pr[i0 + j]
        for j in range(m):
            po[i0 + j] = t[j]


@register_jitable
def _reduce_bool(out, first, rows, op, scale):
    # bool arrays are read and written as bytes; every input byte is
    # normalised to 0/1 (non-zero = True), so the output is always 0/1.
    n = _check(out, first, rows)
    if op < SUM or op > BXOR:
        raise ValueError("shmcoll.kernels: unknown op")
    k = rows.shape[0]
    po = ptr(out)
    pf = ptr(first)
    t = stack_like(pf)
    one = np.uint8(1)
    zero = np.uint8(0)
    for i0 in range(0, n, BLOCK):
        m = min(BLOCK, n - i0)
        for j in range(m):
            t[j] = one if pf[i0 + j] != 0 else zero
        for r in range(k):
            pr = row_ptr(rows, r)
            if op == SUM or op == MAX or op == BOR:
                for j in range(m):
                    t[j] = t[j] | (one if pr[i0 + j] != 0 else zero)
            elif op == BXOR:
                for j in range(m):
                    t[j] = t[j] ^ (one if pr[i0 + j] != 0 else zero)
            else:  # PRODUCT, MIN, BAND
                for j in range(m):
                    t[j] = t[j] & (one if pr[i0 + j] != 0 else zero)
        for j in range(m):
            po[i0 + j] = t[j]


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------

def _sig(arr_type):
    # first and rows are declared read-only: writeable arrays convert to that
    # (as C-layout 2-D rows convert to layout A) without a new compilation,
    # and read-only inputs (e.g. a peer's segment mapped read-only) work too.
    return types.void(types.Array(arr_type, 1, "C"),
                      types.Array(arr_type, 1, "C", readonly=True),
                      types.Array(arr_type, 2, "A", readonly=True),
                      types.int64, types.float64)


# the loop of each kernel family (kernel_abi.DType.family)
FAMILIES = {"float": _reduce_float, "f16": _reduce_f16, "bf16": _reduce_bf16, "int": _reduce_int,
            "bool": _reduce_bool}


def _spec(dtype: str):
    """(family loop, NumPy element type) of dtype's kernel."""
    d = DTYPE_BY_NAME[dtype]
    return FAMILIES[d.family], d.numpy


def _digest(*modules) -> str:
    digest = hashlib.sha256()
    for module in modules:
        with open(module.__file__, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


# Numba's on-disk cache notices a change to this file, but not to the modules its kernels are
# compiled from (numba/numba#8396 would have, never merged): the intrinsics, and kernel_abi's op
# codes, which the kernels read as constants. It does hash the contents of a cached function's
# closure into the cache key, so each function cached here is a closure over this digest of them
# (it compiles to nothing: the same machine code without it).
_SOURCES = _digest(kernel_intrinsics, kernel_abi)

_kernels = {}
_lock = threading.Lock()


def _once(table: dict, dtype: str, build):
    """``table[dtype]``, made by ``build(dtype)`` the first time (under the lock; lookups take none)."""
    value = table.get(dtype)
    if value is not None:
        return value
    if dtype not in DTYPES:
        raise ValueError(f"shmcoll.kernels: unsupported dtype {dtype!r}")
    with _lock:
        if dtype not in table:
            table[dtype] = build(dtype)
    return table[dtype]


def _build_reducer(dtype: str):
    family, np_dtype = _spec(dtype)
    sources = _SOURCES

    def kernel(out, first, rows, op, scale):
        sources  # noqa: B018 (in the closure, so in Numba's cache key: see _SOURCES)
        family(out, first, rows, op, scale)

    # explicit signature: compiled (or loaded from the on-disk cache)
    # right here; the dispatcher then refuses to compile again.
    return njit(_sig(from_dtype(np_dtype)), nogil=True, cache=True)(kernel)


def reducer(dtype: str):
    """Return the compiled kernel for dtype: kernel(out, first, rows, op, scale) -> None.

    Kernels called with NumPy arrays, for the unit tests and bench/bench_kernels.py (the
    collectives call ``entry_point``'s instead)."""
    return _once(_kernels, dtype, _build_reducer)


# C entry points: the same kernels behind the C signature of kernel_abi, called by
# address and without the GIL from the Cython schedules (shmcoll._schedules), so a
# whole collective runs without coming back to Python. kernel_library compiles
# them into a native library; entry_point() is the fallback when it cannot.
_ENTRY_SIG = types.void(types.voidptr, types.voidptr, types.voidptr, types.int64, types.int64,
                        types.int64, types.int64, types.float64)
_entries = {}  # dtype -> compiled entry point (holding it keeps its code alive)


def _make_entry(family, np_dtype, cache: bool):
    # Numba keys its on-disk cache on the pickled closure: ``family`` is a plain
    # function (register_jitable keeps it so) and pickles by name, as does the dtype.
    sources = _SOURCES

    def entry(out, first, rows, nrows, row_stride, n, op, scale):
        sources  # noqa: B018 (in the closure, so in Numba's cache key: see _SOURCES)
        family(carray(out, n, np_dtype), carray(first, n, np_dtype),
               carray(rows, (nrows, row_stride), np_dtype)[:, :n], op, scale)

    return cfunc(_ENTRY_SIG, nopython=True, nogil=True, cache=cache)(entry)


def _build_entry(dtype: str, cache: bool = True):
    return _make_entry(*_spec(dtype), cache)


def compile_entry(dtype: str):
    """A freshly compiled entry point of dtype (not from Numba's cache, so its LLVM IR is
    at hand: ``.inspect_llvm()``, symbol ``.native_name``), for kernel_library."""
    return _build_entry(dtype, cache=False)


def entry_point(dtype: str) -> int:
    """Address of the C entry point of dtype's kernel (compiled or loaded from cache on first use)."""
    return _once(_entries, dtype, _build_entry).address

