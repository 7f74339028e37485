"""Elementwise reduction kernels for shmcoll collectives.

Pure array code (NumPy + numba): no torch, no shared-memory knowledge.

``reducer(dtype)(out, first, rows, op, scale)`` computes, for every index i::

    out[i] = op(first[i], rows[0, i], rows[1, i], ..., rows[k-1, i])

and, for ``op == SUM`` on floating dtypes only, multiplies the result by
``scale`` when ``scale != 1.0`` (AVG, PREMUL_SUM) before storing it.

Arrays the caller must pass (exactly these NumPy dtypes; ``out`` writeable,
``first`` and ``rows`` may be read-only; all with NumPy's ``aligned`` flag):

=========  ==============================  ======================================
dtype      NumPy array dtype               how to get it from a torch tensor
=========  ==============================  ======================================
float32    float32                         ``t.numpy()``
float64    float64                         ``t.numpy()``
float16    uint16 (raw IEEE half bits)     ``t.view(torch.uint16).numpy()``
bfloat16   uint16 (raw bfloat16 bits)      ``t.view(torch.uint16).numpy()``
int8       int8                            ``t.numpy()``
int16      int16                           ``t.numpy()``
int32      int32                           ``t.numpy()``
int64      int64                           ``t.numpy()``
uint8      uint8                           ``t.numpy()``
bool       bool_ (NOT uint8)               ``t.numpy()``
=========  ==============================  ======================================

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
  its inputs, which is what the collectives do, runs as such a one-pass loop
  instead: without the accumulator it is 10-25% faster (float16 1.6x).
* Any wrong array type, dimension count or layout (non-contiguous 1-D, wrong
  dtype such as float16 passed as numpy float16 instead of uint16) raises
  ``TypeError`` from the dispatcher ("No matching definition").

Semantics per dtype:

* float32/float64: arithmetic in the array type.  MIN/MAX propagate NaN like
  ``torch.minimum``/``torch.maximum``.  SUM scale: ``acc * T(scale)`` in the
  array type (scale rounded to float32 for float32).
* float16/bfloat16: every input is widened to float32, all k+1 inputs are
  combined in float32 in the order first, rows[0], rows[1], ..., multiplied by
  ``float32(scale)`` if SUM and scale != 1.0, and rounded once to the 16-bit
  format (round to nearest even; inf stays inf, overflow becomes inf, NaN
  stays NaN).  Float16 conversions use LLVM ``half`` fpext/fptrunc (F16C
  ``vcvtph2ps``/``vcvtps2ph`` on x86-64, so the CPU needs F16C); bfloat16 is
  widened/rounded with integer ops on pairs of elements (one uint32 word
  each).  bfloat16 NaN results are stored as 0x7FC0 (torch may produce other
  NaN bit patterns, e.g. 0xFFFF); float16 NaNs are quiet NaNs.
* int8..int64, uint8: integer arithmetic wrapping modulo 2**bits (like torch);
  ``scale`` is ignored.
* bool: SUM = MAX = BOR = logical or, PRODUCT = MIN = BAND = logical and,
  BXOR = logical xor.  Any non-zero byte reads as True; the output bytes are
  always 0 or 1.  ``scale`` is ignored.

An op that ``supports(dtype, op)`` rejects, mismatched lengths or a row
stride that is not contiguous raise ``ValueError`` from inside the kernel.

All kernels are ``@njit(nogil=True, cache=True)`` with one explicit signature
each, compiled lazily by ``reducer()``; after that the dispatchers never
compile again (compilation is disabled on them).

Collectives call C entry points of the same kernels instead. ``kernel_library``
compiles them (``compile_entry``) into one native library that later processes
load without importing Numba (~1 ms instead of ~0.5 s); ``entry_point()`` here
is its fallback, Numba's JIT with its on-disk cache (10 compilations, ~9 s
cold on a 2-core EPYC).  That cache is numba's:
``NUMBA_CACHE_DIR`` if set, else ``shmcoll/__pycache__/`` next to this file if
writeable, else ``~/.cache/numba``-style user-wide directories, keyed by this
file's mtime/size, the Python version and the host CPU name/features.
"""

import threading

import numpy as np
from llvmlite import ir
from numba import carray, cfunc, njit, types
from numba.core import cgutils
from numba.extending import intrinsic, register_jitable

# op codes, dtypes and supports() live where code that must not import Numba finds them
from shmcoll.kernel_abi import AVG, BAND, BOR, BXOR, DTYPES, MAX, MIN, PRODUCT, SUM, supports

__all__ = [
    "SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG",
    "DTYPES", "NUMPY_DTYPES", "compile_entry", "entry_point", "reducer", "supports",
]


# Elements per block of the on-stack accumulator (float64: 8 KiB, float32 and
# the 16-bit floats: 4 KiB, int8/bool: 1 KiB), so that it and the current
# block of every input stay in L1 while the rows are folded in.  1024 measured
# a few percent faster than 2048 for float16/bfloat16, the same for float32.
_BLOCK = 1024


# ---------------------------------------------------------------------------
# intrinsics
# ---------------------------------------------------------------------------

def _elem_type(dtype):
    # bool arrays are handled as raw bytes
    return types.uint8 if dtype == types.boolean else dtype


@intrinsic
def _ptr(typingctx, arr):
    """Typed pointer to element 0 of a 1-D array (bool -> uint8*)."""
    ptrty = types.CPointer(_elem_type(arr.dtype))
    sig = ptrty(arr)

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        return builder.bitcast(ary.data,
                               context.get_value_type(sig.return_type))

    return sig, codegen


@intrinsic
def _row_ptr(typingctx, rows, r):
    """Typed pointer to rows[r, 0] of a 2-D array (any row stride)."""
    ptrty = types.CPointer(_elem_type(rows.dtype))
    sig = ptrty(rows, types.intp)

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        strides = cgutils.unpack_tuple(builder, ary.strides, 2)
        off = builder.mul(args[1], strides[0])
        base = builder.bitcast(ary.data, ir.IntType(8).as_pointer())
        p = builder.gep(base, [off])
        return builder.bitcast(p, context.get_value_type(sig.return_type))

    return sig, codegen


def _alloca_block(builder, elt):
    with builder.goto_entry_block():
        slot = builder.alloca(ir.ArrayType(elt, _BLOCK))
    slot.align = 64
    return slot


@intrinsic
def _stack_like(typingctx, ptr):
    """Fresh on-stack buffer of _BLOCK elements of ptr's pointee type."""
    sig = ptr(ptr)

    def codegen(context, builder, sig, args):
        elt = context.get_data_type(sig.return_type.dtype)
        slot = _alloca_block(builder, elt)
        return builder.bitcast(slot, context.get_value_type(sig.return_type))

    return sig, codegen


@intrinsic
def _stack_f32(typingctx):
    """Fresh on-stack float32 buffer of _BLOCK elements."""
    sig = types.CPointer(types.float32)()

    def codegen(context, builder, sig, args):
        slot = _alloca_block(builder, ir.FloatType())
        return builder.bitcast(slot, ir.FloatType().as_pointer())

    return sig, codegen


@intrinsic
def _as_elem(typingctx, val, ptr):
    """Cast a scalar to ptr's pointee type."""
    sig = ptr.dtype(val, ptr)

    def codegen(context, builder, sig, args):
        return context.cast(builder, args[0], sig.args[0], sig.return_type)

    return sig, codegen


@intrinsic
def _h2f(typingctx, x):
    """IEEE half bits (uint16) -> float32 (exact), LLVM fpext half."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, sig, args):
        h = builder.bitcast(args[0], ir.HalfType())
        return builder.fpext(h, ir.FloatType())

    return sig, codegen


@intrinsic
def _f2h(typingctx, x):
    """float32 -> IEEE half bits (uint16), round to nearest even."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, sig, args):
        h = builder.fptrunc(args[0], ir.HalfType())
        return builder.bitcast(h, ir.IntType(16))

    return sig, codegen


@intrinsic
def _bf2f(typingctx, x):
    """bfloat16 bits (uint16) -> float32 (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        u = builder.shl(builder.zext(args[0], i32), ir.Constant(i32, 16))
        return builder.bitcast(u, ir.FloatType())

    return sig, codegen


@intrinsic
def _f2bf(typingctx, x):
    """float32 -> bfloat16 bits (uint16), round to nearest even, NaN->0x7FC0."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        i16 = ir.IntType(16)
        f = args[0]
        u = builder.bitcast(f, i32)
        lsb = builder.and_(builder.lshr(u, ir.Constant(i32, 16)),
                           ir.Constant(i32, 1))
        r = builder.add(u, builder.add(lsb, ir.Constant(i32, 0x7FFF)))
        hi = builder.trunc(builder.lshr(r, ir.Constant(i32, 16)), i16)
        isnan = builder.fcmp_unordered("uno", f, f)
        return builder.select(isnan, ir.Constant(i16, 0x7FC0), hi)

    return sig, codegen


def _nan_propagating(predicate: str):
    """NaN-propagating minimum ("<") or maximum (">"), as torch.minimum/maximum, as a branch-free select."""

    def typer(typingctx, a, b):
        sig = a(a, a)

        def codegen(context, builder, sig, args):
            x, y = args
            m = builder.select(builder.fcmp_ordered(predicate, x, y), x, y)
            # x + y is NaN iff x or y is; selecting it (rather than x) keeps the
            # value stored back into the accumulator from being "select(c, load
            # acc, ...)", which LLVM would turn into a slow masked store.
            return builder.select(builder.fcmp_unordered("uno", x, y),
                                  builder.fadd(x, y), m)

        return sig, codegen

    return intrinsic(typer)


_fmin = _nan_propagating("<")
_fmax = _nan_propagating(">")


# bfloat16 pairs: a uint32 word holds elements 2p (low half) and 2p + 1 (high
# half, little-endian).  Both widen to float32 with one integer op each (no
# shuffles), and two rounded results pack back into one word the same way.

@intrinsic
def _ld_pair(typingctx, ptr, p):
    """uint32 word of 16-bit elements 2p and 2p + 1 (2-byte aligned load)."""
    sig = types.uint32(ptr, types.intp)

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        q = builder.gep(args[0], [builder.shl(args[1], ir.Constant(args[1].type, 1))])
        return builder.load(builder.bitcast(q, i32.as_pointer()), align=2)

    return sig, codegen


@intrinsic
def _st_pair(typingctx, ptr, p, w):
    """Store a uint32 word into 16-bit elements 2p and 2p + 1."""
    sig = types.void(ptr, types.intp, types.uint32)

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        q = builder.gep(args[0], [builder.shl(args[1], ir.Constant(args[1].type, 1))])
        builder.store(args[2], builder.bitcast(q, i32.as_pointer()), align=2)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _bf_lo(typingctx, w):
    """float32 value of the bfloat16 in the low half of w."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, sig, args):
        u = builder.shl(args[0], ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(u, ir.FloatType())

    return sig, codegen


@intrinsic
def _bf_hi(typingctx, w):
    """float32 value of the bfloat16 in the high half of w."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, sig, args):
        u = builder.and_(args[0], ir.Constant(ir.IntType(32), 0xFFFF0000))
        return builder.bitcast(u, ir.FloatType())

    return sig, codegen


def _bf_round_hi(builder, f):
    # float32 -> i32 whose high 16 bits are the bfloat16 rounded to nearest
    # even (NaN -> 0x7FC0); the low 16 bits are garbage
    i32 = ir.IntType(32)
    u = builder.bitcast(f, i32)
    lsb = builder.and_(builder.lshr(u, ir.Constant(i32, 16)), ir.Constant(i32, 1))
    r = builder.add(u, builder.add(lsb, ir.Constant(i32, 0x7FFF)))
    isnan = builder.fcmp_unordered("uno", f, f)
    return builder.select(isnan, ir.Constant(i32, 0x7FC00000), r)


@intrinsic
def _bf_pack(typingctx, lo, hi):
    """uint32 word of two bfloat16s rounded from float32 lo and hi."""
    sig = types.uint32(types.float32, types.float32)

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        a = builder.lshr(_bf_round_hi(builder, args[0]), ir.Constant(i32, 16))
        b = builder.and_(_bf_round_hi(builder, args[1]), ir.Constant(i32, 0xFFFF0000))
        return builder.or_(a, b)

    return sig, codegen


def _freeze(builder, val):
    # `freeze` (not in llvmlite's IRBuilder): an opaque copy of val, so that
    # a min/max result stored back to where val was loaded from is not
    # "select(c, load p, x)", which the x86 backend turns into a slow
    # masked store (vpmaskmov).
    instr = ir.Instruction(builder.block, val.type, "freeze", [val])
    builder._insert(instr)
    return instr


def _integer_select(predicate: str):
    """Integer minimum ("<", vpmins*) or maximum (">", vpmaxs*), branch-free."""

    def typer(typingctx, a, b):
        sig = a(a, a)

        def codegen(context, builder, sig, args):
            x = _freeze(builder, args[0])
            y = args[1]
            pick = (builder.icmp_signed(predicate, x, y) if sig.return_type.signed
                    else builder.icmp_unsigned(predicate, x, y))
            return builder.select(pick, x, y)

        return sig, codegen

    return intrinsic(typer)


_imin = _integer_select("<")
_imax = _integer_select(">")


# ---------------------------------------------------------------------------
# kernels: one Python function per family, compiled once per dtype, with the
# op dispatched at run time outside all loops.
#
# Structure (all families): for each block of _BLOCK elements, pass 1 reads
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
def _reduce_float(out, first, rows, op, scale):
    n = _check(out, first, rows)
    divide = op == AVG
    if divide:
        op = SUM
    if op < SUM or op > MAX:
        raise ValueError("shmcoll.kernels: unsupported op for a float dtype")
    k = rows.shape[0]
    po = _ptr(out)
    pf = _ptr(first)
    t = _stack_like(pf)
    s = _as_elem(scale, pf)
    do_scale = op == SUM and scale != 1.0
    done = 0
    # A plain SUM of up to 3 rows (2-4 ranks) into a separate output, in one pass without the
    # accumulator: 10-25% faster (float16: 1.6x). The collectives always reduce into a
    # separate buffer. An output that is also an input keeps the accumulator loops below:
    # LLVM's runtime alias check would send this one to its scalar fallback (up to 7x slower).
    if op == SUM and not divide and not do_scale and 1 <= k <= 3 and _separate(out, first, rows):
        p0 = _row_ptr(rows, 0)
        if k == 1:
            for i in range(n):
                po[i] = pf[i] + p0[i]
        elif k == 2:
            p1 = _row_ptr(rows, 1)
            for i in range(n):
                po[i] = (pf[i] + p0[i]) + p1[i]
        else:
            p1 = _row_ptr(rows, 1)
            p2 = _row_ptr(rows, 2)
            for i in range(n):
                po[i] = ((pf[i] + p0[i]) + p1[i]) + p2[i]
        done = n
    for i0 in range(done, n, _BLOCK):
        m = min(_BLOCK, n - i0)
        r0 = 0
        if op == SUM and k > 0:
            # fused first pass for the common small row counts
            p0 = _row_ptr(rows, 0)
            if k == 1:
                for j in range(m):
                    t[j] = pf[i0 + j] + p0[i0 + j]
                r0 = 1
            elif k == 2:
                p1 = _row_ptr(rows, 1)
                for j in range(m):
                    t[j] = (pf[i0 + j] + p0[i0 + j]) + p1[i0 + j]
                r0 = 2
            else:
                p1 = _row_ptr(rows, 1)
                p2 = _row_ptr(rows, 2)
                for j in range(m):
                    t[j] = ((pf[i0 + j] + p0[i0 + j]) + p1[i0 + j]) + p2[i0 + j]
                r0 = 3
        else:
            for j in range(m):
                t[j] = pf[i0 + j]
        for r in range(r0, k):
            pr = _row_ptr(rows, r)
            if op == SUM:
                for j in range(m):
                    t[j] = t[j] + pr[i0 + j]
            elif op == PRODUCT:
                for j in range(m):
                    t[j] = t[j] * pr[i0 + j]
            elif op == MIN:
                for j in range(m):
                    t[j] = _fmin(t[j], pr[i0 + j])
            else:
                for j in range(m):
                    t[j] = _fmax(t[j], pr[i0 + j])
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
    # identical to _reduce_float, with every input widened by _h2f into the
    # float32 accumulator and the result rounded once by _f2h
    n = _check(out, first, rows)
    divide = op == AVG
    if divide:
        op = SUM
    if op < SUM or op > MAX:
        raise ValueError("shmcoll.kernels: unsupported op for a float dtype")
    k = rows.shape[0]
    po = _ptr(out)
    pf = _ptr(first)
    t = _stack_f32()
    s = np.float32(scale)
    do_scale = op == SUM and scale != 1.0
    done = 0
    # one pass for a plain SUM into a separate output, as in _reduce_float
    if op == SUM and not divide and not do_scale and 1 <= k <= 3 and _separate(out, first, rows):
        p0 = _row_ptr(rows, 0)
        if k == 1:
            for i in range(n):
                po[i] = _f2h(_h2f(pf[i]) + _h2f(p0[i]))
        elif k == 2:
            p1 = _row_ptr(rows, 1)
            for i in range(n):
                po[i] = _f2h((_h2f(pf[i]) + _h2f(p0[i])) + _h2f(p1[i]))
        else:
            p1 = _row_ptr(rows, 1)
            p2 = _row_ptr(rows, 2)
            for i in range(n):
                po[i] = _f2h(((_h2f(pf[i]) + _h2f(p0[i])) + _h2f(p1[i])) + _h2f(p2[i]))
        done = n
    for i0 in range(done, n, _BLOCK):
        m = min(_BLOCK, n - i0)
        r0 = 0
        if op == SUM and k > 0:
            p0 = _row_ptr(rows, 0)
            if k == 1:
                for j in range(m):
                    t[j] = _h2f(pf[i0 + j]) + _h2f(p0[i0 + j])
                r0 = 1
            elif k == 2:
                p1 = _row_ptr(rows, 1)
                for j in range(m):
                    t[j] = ((_h2f(pf[i0 + j]) + _h2f(p0[i0 + j]))
                            + _h2f(p1[i0 + j]))
                r0 = 2
            else:
                p1 = _row_ptr(rows, 1)
                p2 = _row_ptr(rows, 2)
                for j in range(m):
                    t[j] = (((_h2f(pf[i0 + j]) + _h2f(p0[i0 + j]))
                             + _h2f(p1[i0 + j])) + _h2f(p2[i0 + j]))
                r0 = 3
        else:
            for j in range(m):
                t[j] = _h2f(pf[i0 + j])
        for r in range(r0, k):
            pr = _row_ptr(rows, r)
            if op == SUM:
                for j in range(m):
                    t[j] = t[j] + _h2f(pr[i0 + j])
            elif op == PRODUCT:
                for j in range(m):
                    t[j] = t[j] * _h2f(pr[i0 + j])
            elif op == MIN:
                for j in range(m):
                    t[j] = _fmin(t[j], _h2f(pr[i0 + j]))
            else:
                for j in range(m):
                    t[j] = _fmax(t[j], _h2f(pr[i0 + j]))
        if divide:
            for j in range(m):
                po[i0 + j] = _f2h(t[j] / s)
        elif do_scale:
            for j in range(m):
                po[i0 + j] = _f2h(t[j] * s)
        else:
            for j in range(m):
                po[i0 + j] = _f2h(t[j])


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
    po = _ptr(out)
    pf = _ptr(first)
    half = _BLOCK // 2
    te = _stack_f32()  # two separate buffers, so that LLVM sees no
    to = _stack_f32()  # possible overlap between te[j] and to[j]
    s = np.float32(scale)
    do_scale = op == SUM and scale != 1.0
    npairs = n // 2
    done = 0
    # one pass for two ranks' SUM into a separate output, as in _reduce_float (with three or
    # more rows the accumulator loops below measured 5-8% faster for bfloat16)
    if op == SUM and not divide and not do_scale and k == 1 and _separate(out, first, rows):
        q0 = _row_ptr(rows, 0)
        for p in range(npairs):
            a = _ld_pair(pf, p)
            b = _ld_pair(q0, p)
            _st_pair(po, p, _bf_pack(_bf_lo(a) + _bf_lo(b), _bf_hi(a) + _bf_hi(b)))
        done = npairs
    for p0 in range(done, npairs, half):
        m = min(half, npairs - p0)
        r0 = 0
        if op == SUM and k > 0:
            q0 = _row_ptr(rows, 0)
            if k == 1:
                for j in range(m):
                    a = _ld_pair(pf, p0 + j)
                    b = _ld_pair(q0, p0 + j)
                    te[j] = _bf_lo(a) + _bf_lo(b)
                    to[j] = _bf_hi(a) + _bf_hi(b)
                r0 = 1
            elif k == 2:
                q1 = _row_ptr(rows, 1)
                for j in range(m):
                    a = _ld_pair(pf, p0 + j)
                    b = _ld_pair(q0, p0 + j)
                    c = _ld_pair(q1, p0 + j)
                    te[j] = (_bf_lo(a) + _bf_lo(b)) + _bf_lo(c)
                    to[j] = (_bf_hi(a) + _bf_hi(b)) + _bf_hi(c)
                r0 = 2
            else:
                q1 = _row_ptr(rows, 1)
                q2 = _row_ptr(rows, 2)
                for j in range(m):
                    a = _ld_pair(pf, p0 + j)
                    b = _ld_pair(q0, p0 + j)
                    c = _ld_pair(q1, p0 + j)
                    d = _ld_pair(q2, p0 + j)
                    te[j] = ((_bf_lo(a) + _bf_lo(b)) + _bf_lo(c)) + _bf_lo(d)
                    to[j] = ((_bf_hi(a) + _bf_hi(b)) + _bf_hi(c)) + _bf_hi(d)
                r0 = 3
        else:
            for j in range(m):
                a = _ld_pair(pf, p0 + j)
                te[j] = _bf_lo(a)
                to[j] = _bf_hi(a)
        for r in range(r0, k):
            q = _row_ptr(rows, r)
            if op == SUM:
                for j in range(m):
                    b = _ld_pair(q, p0 + j)
                    te[j] = te[j] + _bf_lo(b)
                    to[j] = to[j] + _bf_hi(b)
            elif op == PRODUCT:
                for j in range(m):
                    b = _ld_pair(q, p0 + j)
                    te[j] = te[j] * _bf_lo(b)
                    to[j] = to[j] * _bf_hi(b)
            elif op == MIN:
                for j in range(m):
                    b = _ld_pair(q, p0 + j)
                    te[j] = _fmin(te[j], _bf_lo(b))
                    to[j] = _fmin(to[j], _bf_hi(b))
            else:
                for j in range(m):
                    b = _ld_pair(q, p0 + j)
                    te[j] = _fmax(te[j], _bf_lo(b))
                    to[j] = _fmax(to[j], _bf_hi(b))
        if divide:
            for j in range(m):
                _st_pair(po, p0 + j, _bf_pack(te[j] / s, to[j] / s))
        elif do_scale:
            for j in range(m):
                _st_pair(po, p0 + j, _bf_pack(te[j] * s, to[j] * s))
        else:
            for j in range(m):
                _st_pair(po, p0 + j, _bf_pack(te[j], to[j]))
    if n % 2 == 1:
        i = n - 1
        x = _bf2f(pf[i])
        for r in range(k):
            y = _bf2f(_row_ptr(rows, r)[i])
            if op == SUM:
                x = x + y
            elif op == PRODUCT:
                x = x * y
            elif op == MIN:
                x = _fmin(x, y)
            else:
                x = _fmax(x, y)
        if divide:
            x = x / s
        elif do_scale:
            x = x * s
        po[i] = _f2bf(x)


@register_jitable
def _reduce_int(out, first, rows, op, scale):
    # integer arithmetic wraps (intermediates are truncated to the element
    # type on every store); scale is ignored.
    n = _check(out, first, rows)
    if op < SUM or op > BXOR:
        raise ValueError("shmcoll.kernels: unknown op")
    k = rows.shape[0]
    po = _ptr(out)
    pf = _ptr(first)
    t = _stack_like(pf)
    for i0 in range(0, n, _BLOCK):
        m = min(_BLOCK, n - i0)
        r0 = 0
        if op == SUM and k > 0:
            p0 = _row_ptr(rows, 0)
            for j in range(m):
                t[j] = pf[i0 + j] + p0[i0 + j]
            r0 = 1
        else:
            for j in range(m):
                t[j] = pf[i0 + j]
        for r in range(r0, k):
            pr = _row_ptr(rows, r)
            if op == SUM:
                for j in range(m):
                    t[j] = t[j] + pr[i0 + j]
            elif op == PRODUCT:
                for j in range(m):
                    t[j] = t[j] * pr[i0 + j]
            elif op == MIN:
                for j in range(m):
                    t[j] = _imin(t[j], pr[i0 + j])
            elif op == MAX:
                for j in range(m):
                    t[j] = _imax(t[j], pr[i0 + j])
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
    po = _ptr(out)
    pf = _ptr(first)
    t = _stack_like(pf)
    one = np.uint8(1)
    zero = np.uint8(0)
    for i0 in range(0, n, _BLOCK):
        m = min(_BLOCK, n - i0)
        for j in range(m):
            t[j] = one if pf[i0 + j] != 0 else zero
        for r in range(k):
            pr = _row_ptr(rows, r)
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


_SPECS = {
    "float32": (_reduce_float, types.float32),
    "float64": (_reduce_float, types.float64),
    "float16": (_reduce_f16, types.uint16),
    "bfloat16": (_reduce_bf16, types.uint16),
    "int8": (_reduce_int, types.int8),
    "int16": (_reduce_int, types.int16),
    "int32": (_reduce_int, types.int32),
    "int64": (_reduce_int, types.int64),
    "uint8": (_reduce_int, types.uint8),
    "bool": (_reduce_bool, types.boolean),
}

# numpy dtype of the arrays each kernel takes (see the module docstring)
NUMPY_DTYPES = {
    "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
    "float16": np.dtype(np.uint16), "bfloat16": np.dtype(np.uint16),
    "int8": np.dtype(np.int8), "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8), "bool": np.dtype(np.bool_),
}

_kernels = {}
_lock = threading.Lock()


def _once(table: dict, dtype: str, build):
    """``table[dtype]``, made by ``build(dtype)`` the first time (under the lock; lookups take none)."""
    value = table.get(dtype)
    if value is not None:
        return value
    if dtype not in _SPECS:
        raise ValueError(f"shmcoll.kernels: unsupported dtype {dtype!r}")
    with _lock:
        if dtype not in table:
            table[dtype] = build(dtype)
    return table[dtype]


def _build_reducer(dtype: str):
    pyfunc, elt = _SPECS[dtype]
    # explicit signature: compiled (or loaded from the on-disk cache)
    # right here; the dispatcher then refuses to compile again.
    return njit(_sig(elt), nogil=True, cache=True)(pyfunc)


def reducer(dtype: str):
    """Return the compiled kernel for dtype: kernel(out, first, rows, op, scale) -> None."""
    return _once(_kernels, dtype, _build_reducer)


# C entry points: the same kernels behind the C signature of kernel_abi, called by
# address and without the GIL from the Cython schedules (shmcoll._reduce), so a
# whole collective runs without coming back to Python. kernel_library compiles
# them into a native library; entry_point() is the fallback when it cannot.
_ENTRY_SIG = types.void(types.voidptr, types.voidptr, types.voidptr, types.int64, types.int64,
                        types.int64, types.int64, types.float64)
_entries = {}  # dtype -> compiled entry point (holding it keeps its code alive)


def _make_entry(family, np_dtype, cache: bool):
    # Numba keys its on-disk cache on the pickled closure: ``family`` is a plain
    # function (register_jitable keeps it so) and pickles by name, as does the dtype.
    def entry(out, first, rows, nrows, row_stride, n, op, scale):
        family(carray(out, n, np_dtype), carray(first, n, np_dtype),
               carray(rows, (nrows, row_stride), np_dtype)[:, :n], op, scale)

    return cfunc(_ENTRY_SIG, nopython=True, nogil=True, cache=cache)(entry)


def _build_entry(dtype: str, cache: bool = True):
    family, _ = _SPECS[dtype]
    return _make_entry(family, NUMPY_DTYPES[dtype], cache)


def compile_entry(dtype: str):
    """A freshly compiled entry point of dtype (not from Numba's cache, so its LLVM IR is
    at hand: ``.inspect_llvm()``, symbol ``.native_name``), for kernel_library."""
    return _build_entry(dtype, cache=False)


def entry_point(dtype: str) -> int:
    """Address of the C entry point of dtype's kernel (compiled or loaded from cache on first use)."""
    return _once(_entries, dtype, _build_entry).address

