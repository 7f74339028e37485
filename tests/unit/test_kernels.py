"""Tests for shmcoll.kernels against NumPy / torch references."""

import numpy as np
import pytest
import torch

from shmcoll import kernel_abi
from shmcoll import kernels as K

SUM, PRODUCT, MIN, MAX = K.SUM, K.PRODUCT, K.MIN, K.MAX
BAND, BOR, BXOR = K.BAND, K.BOR, K.BXOR
ALL_OPS = (SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR)
FLOAT_OPS = (SUM, PRODUCT, MIN, MAX)


def _of(nature):
    return tuple(d for d in K.DTYPES if kernel_abi.DTYPE_BY_NAME[d].nature == nature)


# derived from kernel_abi's table, so that a dtype added there is swept too
INT_DTYPES = _of(kernel_abi.INTEGER)
FLOAT_DTYPES = _of(kernel_abi.FLOAT)
HALF_DTYPES = tuple(d for d in FLOAT_DTYPES if kernel_abi.DTYPE_BY_NAME[d].numpy.kind == "u")  # raw 16-bit patterns
TORCH = {name: getattr(torch, name) for name in K.DTYPES}
# dtype of the numpy arrays each kernel takes
NP = {name: kernel_abi.DTYPE_BY_NAME[name].numpy.type for name in K.DTYPES}
SIZES = (0, 1, 7, 1000, 100003)


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def to_torch(dtype, arr):
    """numpy kernel array -> torch tensor of the logical dtype (copy)."""
    t = torch.from_numpy(np.array(arr, copy=True))
    if dtype in HALF_DTYPES:
        t = t.view(torch.uint16).view(TORCH[dtype])
    return t


def to_numpy(dtype, t):
    """torch tensor of the logical dtype -> numpy kernel array."""
    if dtype in HALF_DTYPES:
        return t.contiguous().view(torch.uint16).numpy().copy()
    return t.contiguous().numpy().copy()


def random_values(dtype, shape, rng):
    """Random numpy kernel array of the given shape."""
    if dtype in FLOAT_DTYPES:
        x = torch.from_numpy(rng.standard_normal(shape) * 3.0)
        return to_numpy(dtype, x.to(TORCH[dtype]))
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(np.bool_)
    info = np.iinfo(NP[dtype])
    return rng.integers(info.min, info.max, shape, dtype=NP[dtype], endpoint=True)


def make_case(dtype, n, k, rng, pad=5):
    """first (1-D), rows as a strided view (k, n) of a bigger buffer."""
    first = random_values(dtype, n, rng)
    big = random_values(dtype, (max(k, 1) + 1, n + 2 * pad + 3), rng)
    off = int(rng.integers(0, pad + 1))
    rows = big[1:k + 1, off:off + n]
    assert rows.shape == (k, n)
    return first, big, rows


def torch_fold(dtype, op, inputs, scale=1.0, divisor=None):
    """Reference: combine inputs (list of numpy kernel arrays) in order.

    Floating types are computed in float32 (half types widened first) or
    float64 and rounded once; integer/bool types use torch's own wrapping /
    logical arithmetic, one step at a time.
    """
    ts = [to_torch(dtype, a) for a in inputs]
    if dtype in FLOAT_DTYPES:
        acc_dt = torch.float64 if dtype == "float64" else torch.float32
        ts = [t.to(acc_dt) for t in ts]
    acc = ts[0].clone()
    for t in ts[1:]:
        if op == SUM:
            acc = acc + t
        elif op == PRODUCT:
            acc = acc * t
        elif op == MIN:
            acc = torch.minimum(acc, t)
        elif op == MAX:
            acc = torch.maximum(acc, t)
        elif op == BAND:
            acc = acc & t
        elif op == BOR:
            acc = acc | t
        elif op == BXOR:
            acc = acc ^ t
        else:
            raise AssertionError(op)
    if dtype in FLOAT_DTYPES and op == SUM and scale != 1.0:
        acc = acc * torch.tensor(scale, dtype=acc.dtype)
    if divisor is not None:
        acc = acc / divisor
    return to_numpy(dtype, acc.to(TORCH[dtype]))


def assert_same(dtype, got, exp):
    assert got.dtype == exp.dtype and got.shape == exp.shape
    if dtype in FLOAT_DTYPES:
        g = to_torch(dtype, got).double().numpy()
        e = to_torch(dtype, exp).double().numpy()
        bad = ~((g == e) | (np.isnan(g) & np.isnan(e)))
    else:
        bad = got != exp
    if bad.any():
        idx = np.flatnonzero(bad)[:5]
        raise AssertionError(f"{dtype}: {bad.sum()} of {bad.size} differ, "
                             f"e.g. at {idx.tolist()}: got {got[idx]} expected {exp[idx]}")


def ops_for(dtype):
    return [op for op in ALL_OPS if K.supports(dtype, op)]


# ---------------------------------------------------------------------------
# the big cross product: dtype x op x k x n x aliasing
# ---------------------------------------------------------------------------

CASES = [(dt, op) for dt in K.DTYPES for op in ops_for(dt)]


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 7])
@pytest.mark.parametrize("dtype,op", CASES)
def test_reduce_matches_reference(dtype, op, k):
    kern = K.reducer(dtype)
    rng = np.random.default_rng([K.DTYPES.index(dtype), op, k])
    for n in SIZES:
        for alias in ("none", "first", "row"):
            if alias == "row" and k == 0:
                continue
            first, big, rows = make_case(dtype, n, k, rng)
            exp = torch_fold(dtype, op, [first] + list(rows))
            if alias == "none":
                out = np.full(n, 3, dtype=NP[dtype])
            elif alias == "first":
                out = first
            else:
                out = rows[k // 2]  # a view into big: writes go to the row
            kern(out, first, rows, op, 1.0)
            assert_same(dtype, out, exp)
            if alias == "row" and n > 0:
                assert np.shares_memory(out, big)


@pytest.mark.parametrize("dtype", K.DTYPES)
def test_c_contiguous_rows_and_no_recompilation(dtype):
    kern = K.reducer(dtype)
    rng = np.random.default_rng(1)
    n, k = 257, 3
    first = random_values(dtype, n, rng)
    rows = np.ascontiguousarray(random_values(dtype, (k, n), rng))
    assert rows.flags.c_contiguous
    out = np.empty_like(first)
    kern(out, first, rows, SUM, 1.0)
    assert_same(dtype, out, torch_fold(dtype, SUM, [first] + list(rows)))
    # Fortran-ordered rows with k = 1 are still contiguous per row
    kern(out, first, np.asfortranarray(rows[:1]), SUM, 1.0)
    assert_same(dtype, out, torch_fold(dtype, SUM, [first, rows[0]]))
    assert len(kern.signatures) == 1
    assert len(kern.overloads) == 1
    assert kern.targetoptions.get("nogil") is True


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "bool"])
def test_read_only_inputs_accepted_read_only_out_rejected(dtype):
    kern = K.reducer(dtype)
    rng = np.random.default_rng(5)
    n, k = 1001, 2
    first, big, rows = make_case(dtype, n, k, rng)
    first.flags.writeable = False
    big.flags.writeable = False
    rows = big[1:k + 1, 2:2 + n]
    exp = torch_fold(dtype, SUM, [first] + list(rows))
    out = np.empty_like(first)
    kern(out, first, rows, SUM, 1.0)
    assert_same(dtype, out, exp)
    assert len(kern.overloads) == 1
    with pytest.raises(TypeError):
        kern(first, first, rows, SUM, 1.0)


def test_every_kernel_compiles_once():
    for dtype in K.DTYPES:
        K.entry_point(dtype)  # the JIT entry points (kernel_library's fallback) beside the array kernels
    seen = set()
    for dtype in K.DTYPES:
        kern = K.reducer(dtype)
        assert kern is K.reducer(dtype)
        assert len(kern.signatures) == 1
        seen.add(id(kern))
        sig = kern.signatures[0]
        assert str(sig[0].dtype) == ("bool" if dtype == "bool" else np.dtype(NP[dtype]).name)
        assert sig[2].ndim == 2 and sig[2].layout == "A"
    assert len(seen) == len(K.DTYPES)  # float16 and bfloat16 differ


def test_float16_and_bfloat16_are_different_kernels():
    a = np.array([0x3C00], np.uint16)  # fp16: 1.0; bf16: 2**-7
    rows = np.array([[0x3C00]], np.uint16)
    o16 = np.empty(1, np.uint16)
    obf = np.empty(1, np.uint16)
    K.reducer("float16")(o16, a, rows, SUM, 1.0)
    K.reducer("bfloat16")(obf, a, rows, SUM, 1.0)
    assert o16[0] == 0x4000  # fp16 1 + 1 = 2
    assert obf[0] == to_numpy("bfloat16", to_torch("bfloat16", a) * 2)[0]
    assert o16[0] != obf[0]


# ---------------------------------------------------------------------------
# half precision: accumulate in float32, round once, specials
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_half_sum_rounded_once_like_torch_stack(dtype, k):
    rng = np.random.default_rng(k)
    n = 50021
    first, _, rows = make_case(dtype, n, k, rng)
    out = np.empty_like(first)
    K.reducer(dtype)(out, first, rows, SUM, 1.0)
    stacked = torch.stack([to_torch(dtype, a) for a in [first] + list(rows)])
    exp = to_numpy(dtype, stacked.float().sum(0).to(TORCH[dtype]))
    assert_same(dtype, out, exp)
    if k >= 2:
        # and it is not the step-by-step rounded result (differs somewhere)
        acc = to_torch(dtype, first)
        for r in rows:
            acc = acc + to_torch(dtype, r)
        assert not np.array_equal(to_numpy(dtype, acc), out)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_specials(dtype):
    tdt = TORCH[dtype]
    big = torch.finfo(tdt).max
    inf, nan = float("inf"), float("nan")
    vals_a = [1.0, big, big, -big, inf, inf, -inf, nan, 1.0, 0.0, -0.0, 1e-30, 3.0]
    vals_b = [2.0 ** -9, big, -big, -big, 1.0, -inf, -inf, 1.0, nan, -0.0, -0.0, 1e-30, -3.0]
    a = to_numpy(dtype, torch.tensor(vals_a).to(tdt))
    b = to_numpy(dtype, torch.tensor(vals_b).to(tdt))
    rows = b[None, :]
    for op in FLOAT_OPS:
        out = np.empty_like(a)
        K.reducer(dtype)(out, a, rows, op, 1.0)
        assert_same(dtype, out, torch_fold(dtype, op, [a, b]))
    # big + big overflows to inf, inf + -inf is NaN, NaN stays NaN
    out = np.empty_like(a)
    K.reducer(dtype)(out, a, rows, SUM, 1.0)
    got = to_torch(dtype, out).float()
    assert got[1] == inf and got[3] == -inf and got[6] == -inf
    assert torch.isnan(got[5]) and torch.isnan(got[7]) and torch.isnan(got[8])


def test_bfloat16_round_to_nearest_even():
    # 1 + 2**-8 is exactly half-way between 1.0 and 1.0078125: ties to even
    # (1.0); 1.0078125 + 2**-8 ties to 1.015625 (even mantissa); a hair
    # above half-way (+ 2**-20, exact in the float32 accumulator) rounds up.
    def bits(x):
        return to_numpy("bfloat16", torch.tensor([x]).to(torch.bfloat16))[0]
    one, ulp = bits(1.0), bits(1.0078125)
    assert (one, ulp) == (0x3F80, 0x3F81)
    tiny, hair = bits(2.0 ** -8), bits(2.0 ** -20)
    first = np.array([one, ulp, one], np.uint16)
    rows = np.array([[tiny, tiny, tiny], [0, 0, hair]], np.uint16)
    out = np.empty(3, np.uint16)
    K.reducer("bfloat16")(out, first, rows, SUM, 1.0)
    assert out.tolist() == [0x3F80, 0x3F82, 0x3F81]


# ---------------------------------------------------------------------------
# floats: NaN propagation for MIN/MAX, scale
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", [MIN, MAX])
@pytest.mark.parametrize("k", [0, 1, 2, 3, 5])
def test_min_max_propagate_nan(dtype, op, k):
    rng = np.random.default_rng(7)
    n = 4099
    first, _, rows = make_case(dtype, n, k, rng)
    nan = to_numpy(dtype, torch.tensor([float("nan")]).to(TORCH[dtype]))[0]
    first[::7] = nan
    for r in range(k):
        rows[r, 3 + r::11] = nan
    out = np.empty_like(first)
    K.reducer(dtype)(out, first, rows, op, 1.0)
    exp = torch_fold(dtype, op, [first] + list(rows))
    assert_same(dtype, out, exp)
    isnan = np.isnan(to_torch(dtype, out).double().numpy())
    expect_nan = np.zeros(n, bool)
    expect_nan[::7] = True
    for r in range(k):
        expect_nan[3 + r::11] = True
    assert np.array_equal(isnan, expect_nan)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("k", [0, 1, 3, 4])
@pytest.mark.parametrize("scale", [0.25, 1.0 / 3.0, -1.5])
def test_sum_scale(dtype, k, scale):
    rng = np.random.default_rng(11)
    n = 10007
    first, _, rows = make_case(dtype, n, k, rng)
    out = np.empty_like(first)
    K.reducer(dtype)(out, first, rows, SUM, scale)
    assert_same(dtype, out, torch_fold(dtype, SUM, [first] + list(rows), scale))
    # scale applies to SUM only
    for op in (PRODUCT, MIN, MAX):
        K.reducer(dtype)(out, first, rows, op, scale)
        assert_same(dtype, out, torch_fold(dtype, op, [first] + list(rows)))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("k", [0, 1, 2, 3, 5])
def test_avg_divides_the_sum_once(dtype, k):
    """AVG = the accumulated sum divided by scale, correctly rounded (not times 1/scale)."""
    rng = np.random.default_rng(5)
    n = 4099
    first, _, rows = make_case(dtype, n, k, rng)
    out = np.empty_like(first)
    K.reducer(dtype)(out, first, rows, K.AVG, float(k + 1))
    assert_same(dtype, out, torch_fold(dtype, SUM, [first] + list(rows), divisor=k + 1))


def test_float32_sum_is_sequential_float32():
    rng = np.random.default_rng(3)
    n, k = 3001, 5
    first = rng.standard_normal(n).astype(np.float32) * 1e4
    rows = rng.standard_normal((k, n)).astype(np.float32)
    exp = first.copy()
    for r in rows:
        exp = exp + r  # numpy float32, in order
    out = np.empty_like(first)
    K.reducer("float32")(out, first, rows, SUM, 1.0)
    assert np.array_equal(out, exp)
    exp64 = (first.astype(np.float64) + rows.astype(np.float64).sum(0)).astype(np.float32)
    assert not np.array_equal(out, exp64)  # i.e. no wider accumulation


# ---------------------------------------------------------------------------
# integers and bool
# ---------------------------------------------------------------------------

def test_int8_wraps_like_torch():
    first = np.array([100, -128, 127, 16], np.int8)
    rows = np.array([[100, -1, 1, 16]], np.int8)
    out = np.empty_like(first)
    K.reducer("int8")(out, first, rows, SUM, 1.0)
    assert out.tolist() == [-56, 127, -128, 32]
    K.reducer("int8")(out, first, rows, PRODUCT, 1.0)
    assert out.tolist() == (torch.from_numpy(first) * torch.from_numpy(rows[0])).tolist()
    assert out.tolist() == [16, -128, 127, 0]


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_wraparound_extremes(dtype):
    info = np.iinfo(NP[dtype])
    vals = np.array([info.max, info.min, info.max, info.min, -1 if info.min < 0 else 1,
                     info.max // 2 + 1], NP[dtype])
    first = np.tile(vals, 500)
    rows = np.stack([np.roll(first, 1), np.roll(first, 2), first])
    for op in ALL_OPS:
        out = np.empty_like(first)
        K.reducer(dtype)(out, first, rows, op, 1.0)
        assert_same(dtype, out, torch_fold(dtype, op, [first] + list(rows)))
    out = np.empty_like(first)
    K.reducer(dtype)(out, first, rows[:1], SUM, 1.0)
    exp = ((first.astype(object) + rows[0].astype(object) - info.min)
           % (int(info.max) - int(info.min) + 1) + info.min).astype(NP[dtype])
    assert np.array_equal(out, exp)


def test_bool_semantics_and_nonzero_bytes():
    a = np.array([0, 0, 1, 1], np.bool_)
    b = np.array([0, 1, 0, 1], np.bool_)
    expect = {SUM: [0, 1, 1, 1], PRODUCT: [0, 0, 0, 1], MIN: [0, 0, 0, 1], MAX: [0, 1, 1, 1],
              BAND: [0, 0, 0, 1], BOR: [0, 1, 1, 1], BXOR: [0, 1, 1, 0]}
    kern = K.reducer("bool")
    for op, e in expect.items():
        out = np.empty(4, np.bool_)
        kern(out, a, b[None, :], op, 1.0)
        assert out.tolist() == [bool(x) for x in e]
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        if op == SUM:
            assert out.tolist() == (ta + tb).tolist()
        if op == PRODUCT:
            assert out.tolist() == (ta * tb).tolist()
    # bytes other than 0/1 read as True; output bytes are 0/1
    raw = np.array([0, 2, 255, 0, 7], np.uint8)
    first = raw.view(np.bool_)
    rows = np.array([[0, 0, 4, 9, 3]], np.uint8).view(np.bool_)
    out = np.empty(5, np.bool_)
    kern(out, first, rows, BXOR, 1.0)
    assert out.view(np.uint8).tolist() == [0, 1, 0, 1, 0]
    kern(out, first, rows, BAND, 1.0)
    assert out.view(np.uint8).tolist() == [0, 0, 1, 0, 1]
    kern(out, first, rows, SUM, 1.0)
    assert out.view(np.uint8).tolist() == [0, 1, 1, 1, 1]


# ---------------------------------------------------------------------------
# API surface and error handling
# ---------------------------------------------------------------------------

def test_op_codes_and_dtypes():
    assert (K.SUM, K.PRODUCT, K.MIN, K.MAX, K.BAND, K.BOR, K.BXOR, K.AVG) == (0, 1, 2, 3, 4, 5, 6, 7)
    assert set(K.DTYPES) >= {"float32", "float64", "float16", "bfloat16", "int8", "int16",
                             "int32", "int64", "uint8", "bool"}
    assert (HALF_DTYPES, INT_DTYPES) == (("float16", "bfloat16"), ("int8", "int16", "int32", "int64", "uint8"))
    assert NP["float16"] is NP["bfloat16"] is np.uint16 and NP["bool"] is np.bool_


def test_the_tables_are_consistent():
    """kernel_abi's tables: names and codes unique, codes fit their descriptor fields (dtype 5 bits,
    op 4, 0 meaning none), and each dtype with a kernel has a NumPy type of its torch dtype's size, a
    nature and a family loop here; one without has none of them."""
    names = [d.name for d in kernel_abi.DTYPE_TABLE]
    codes = [d.code for d in kernel_abi.DTYPE_TABLE]
    assert len(set(names)) == len(names) and len(set(codes)) == len(codes)
    assert all(1 <= code < 32 for code in codes)
    for d in kernel_abi.DTYPE_TABLE:
        assert isinstance(getattr(torch, d.name), torch.dtype), d.name
        if d.family is None:
            assert d.numpy is None and d.nature is None, d
            continue
        assert d.family in K.FAMILIES, d
        assert d.nature in (kernel_abi.FLOAT, kernel_abi.INTEGER, kernel_abi.BOOL), d
        assert d.numpy.itemsize == getattr(torch, d.name).itemsize, d
    assert K.DTYPES == tuple(d.name for d in kernel_abi.DTYPE_TABLE if d.family is not None)
    ops = kernel_abi.REDUCE_OPS
    assert sorted(op.kernel for op in ops) == list(range(len(ops))) and len(ops) + 1 < 16
    assert len({op.name for op in ops}) == len(ops)
    assert all(op.natures <= {kernel_abi.FLOAT, kernel_abi.INTEGER, kernel_abi.BOOL} for op in ops)


def test_supports_truth_table():
    for dt in K.DTYPES:
        is_float = dt in FLOAT_DTYPES
        for op in ALL_OPS:
            bitwise = op in (BAND, BOR, BXOR)
            assert K.supports(dt, op) is (not (is_float and bitwise)), (dt, op)
        assert K.supports(dt, K.AVG) is is_float, (dt, "avg")
        assert K.supports(dt, 8) is False
        assert K.supports(dt, -1) is False
    assert K.supports("complex64", SUM) is False
    assert K.supports("uint16", SUM) is False
    with pytest.raises(ValueError):
        K.reducer("uint16")


@pytest.mark.parametrize("dtype", K.DTYPES)
def test_unsupported_op_raises(dtype):
    kern = K.reducer(dtype)
    first = np.zeros(4, NP[dtype])
    rows = np.zeros((1, 4), NP[dtype])
    out = np.zeros(4, NP[dtype])
    for op in (-1, 8, 100) if dtype in FLOAT_DTYPES else (-1, K.AVG, 8, 100):
        with pytest.raises(ValueError):
            kern(out, first, rows, op, 1.0)
    for op in (BAND, BOR, BXOR):
        if K.supports(dtype, op):
            kern(out, first, rows, op, 1.0)
        else:
            with pytest.raises(ValueError):
                kern(out, first, rows, op, 1.0)


def test_bad_shapes_raise():
    kern = K.reducer("float32")
    f = np.zeros(8, np.float32)
    with pytest.raises(ValueError):
        kern(np.zeros(7, np.float32), f, np.zeros((1, 8), np.float32), SUM, 1.0)
    with pytest.raises(ValueError):
        kern(np.zeros(8, np.float32), f, np.zeros((1, 9), np.float32), SUM, 1.0)
    with pytest.raises(ValueError):  # rows not contiguous within a row
        kern(np.zeros(8, np.float32), f, np.zeros((1, 16), np.float32)[:, ::2], SUM, 1.0)
    with pytest.raises(TypeError):  # wrong element type: no matching signature
        kern(np.zeros(8, np.float64), np.zeros(8), np.zeros((1, 8)), SUM, 1.0)
