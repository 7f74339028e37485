"""The LLVM-level pieces the reduction kernels (``kernels``) are written with.

Numba's nopython Python cannot say a few things the kernels need to run at
memory speed, so each is an ``@intrinsic`` that emits the LLVM IR directly
(llvmlite):

* typed pointers into arrays (``ptr``, ``row_ptr``): loops indexed through them
  carry no bounds checks or stride arithmetic, so LLVM vectorises them;
* on-stack accumulators of ``BLOCK`` elements, 64-byte aligned (``stack_like``,
  ``stack_f32``): no allocation per call, and they stay in L1;
* the 16-bit floats, which NumPy and Numba only see as uint16 bits: float16
  through LLVM ``half`` fpext/fptrunc (F16C ``vcvtph2ps``/``vcvtps2ph`` on
  x86-64), bfloat16 widened and rounded (to nearest even, NaN -> 0x7FC0) with
  integer ops, two elements to a uint32 word so that no shuffles are needed;
* min/max as branch-free selects: for floats NaN-propagating like
  ``torch.minimum``/``torch.maximum``, for integers behind a ``freeze`` that
  keeps the x86 backend from turning the store into a slow masked one.

No torch, no shared memory, no kernels: only what they are built from. The
kernel library's key hashes this file with ``kernels.py`` (``kernel_library``),
and so does the key of Numba's on-disk cache of the kernels (``kernels``), so a
change here compiles them afresh.
"""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "BLOCK", "ptr", "row_ptr", "stack_like", "stack_f32", "as_elem", "h2f", "f2h", "bf2f", "f2bf",
    "fmin", "fmax", "ld_pair", "st_pair", "bf_lo", "bf_hi", "bf_pack", "imin", "imax",
]

# Elements per block of the on-stack accumulator (float64: 8 KiB, float32 and
# the 16-bit floats: 4 KiB, int8/bool: 1 KiB), so that it and the current
# block of every input stay in L1 while the rows are folded in.  1024 measured
# a few percent faster than 2048 for float16/bfloat16, the same for float32.
BLOCK = 1024


def _elem_type(dtype):
    # bool arrays are handled as raw bytes
    return types.uint8 if dtype == types.boolean else dtype


@intrinsic
def ptr(typingctx, arr):
    """Typed pointer to element 0 of a 1-D array (bool -> uint8*)."""
    ptrty = types.CPointer(_elem_type(arr.dtype))
    sig = ptrty(arr)

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        return builder.bitcast(ary.data,
                               context.get_value_type(sig.return_type))

    return sig, codegen


@intrinsic
def row_ptr(typingctx, rows, r):
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
        slot = builder.alloca(ir.ArrayType(elt, BLOCK))
    slot.align = 64
    return slot


@intrinsic
def stack_like(typingctx, ptr):
    """Fresh on-stack buffer of BLOCK elements of ptr's pointee type."""
    sig = ptr(ptr)

    def codegen(context, builder, sig, args):
        elt = context.get_data_type(sig.return_type.dtype)
        slot = _alloca_block(builder, elt)
        return builder.bitcast(slot, context.get_value_type(sig.return_type))

    return sig, codegen


@intrinsic
def stack_f32(typingctx):
    """Fresh on-stack float32 buffer of BLOCK elements."""
    sig = types.CPointer(types.float32)()

    def codegen(context, builder, sig, args):
        slot = _alloca_block(builder, ir.FloatType())
        return builder.bitcast(slot, ir.FloatType().as_pointer())

    return sig, codegen


@intrinsic
def as_elem(typingctx, val, ptr):
    """Cast a scalar to ptr's pointee type."""
    sig = ptr.dtype(val, ptr)

    def codegen(context, builder, sig, args):
        return context.cast(builder, args[0], sig.args[0], sig.return_type)

    return sig, codegen


@intrinsic
def h2f(typingctx, x):
    """IEEE half bits (uint16) -> float32 (exact), LLVM fpext half."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, sig, args):
        h = builder.bitcast(args[0], ir.HalfType())
        return builder.fpext(h, ir.FloatType())

    return sig, codegen


@intrinsic
def f2h(typingctx, x):
    """float32 -> IEEE half bits (uint16), round to nearest even."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, sig, args):
        h = builder.fptrunc(args[0], ir.HalfType())
        return builder.bitcast(h, ir.IntType(16))

    return sig, codegen


@intrinsic
def bf2f(typingctx, x):
    """bfloat16 bits (uint16) -> float32 (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        u = builder.shl(builder.zext(args[0], i32), ir.Constant(i32, 16))
        return builder.bitcast(u, ir.FloatType())

    return sig, codegen


@intrinsic
def f2bf(typingctx, x):
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


fmin = _nan_propagating("<")
fmax = _nan_propagating(">")


# bfloat16 pairs: a uint32 word holds elements 2p (low half) and 2p + 1 (high
# half, little-endian).  Both widen to float32 with one integer op each (no
# shuffles), and two rounded results pack back into one word the same way.

@intrinsic
def ld_pair(typingctx, ptr, p):
    """uint32 word of 16-bit elements 2p and 2p + 1 (2-byte aligned load)."""
    sig = types.uint32(ptr, types.intp)

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        q = builder.gep(args[0], [builder.shl(args[1], ir.Constant(args[1].type, 1))])
        return builder.load(builder.bitcast(q, i32.as_pointer()), align=2)

    return sig, codegen


@intrinsic
def st_pair(typingctx, ptr, p, w):
    """Store a uint32 word into 16-bit elements 2p and 2p + 1."""
    sig = types.void(ptr, types.intp, types.uint32)

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        q = builder.gep(args[0], [builder.shl(args[1], ir.Constant(args[1].type, 1))])
        builder.store(args[2], builder.bitcast(q, i32.as_pointer()), align=2)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def bf_lo(typingctx, w):
    """float32 value of the bfloat16 in the low half of w."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, sig, args):
        u = builder.shl(args[0], ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(u, ir.FloatType())

    return sig, codegen


@intrinsic
def bf_hi(typingctx, w):
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
def bf_pack(typingctx, lo, hi):
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


imin = _integer_select("<")
imax = _integer_select(">")
