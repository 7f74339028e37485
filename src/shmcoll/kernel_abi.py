"""What the reduction kernels compute and how they are called, without importing Numba.

The collectives need the op codes, the dtypes and which ops each dtype supports
before any kernel is loaded (to check a user's arguments), and on the fast
start-up path the kernels come from a native library (``kernel_library``), so
Numba is never imported at all. ``kernels`` compiles what this module names.

C entry point of each dtype's kernel (called by address, without the GIL, from
the Cython schedules in ``shmcoll._reduce``)::

    void entry(void *out, const void *first, const void *rows, int64 nrows,
               int64 row_stride, int64 n, int64 op, double scale)

``rows`` holds ``nrows`` rows of ``n`` elements, row r + 1 starting
``row_stride`` elements after row r; element types and semantics are in the
``kernels`` docstring.
"""

__all__ = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "DTYPES", "FLOAT_DTYPES", "supports"]

# op codes
SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR = 0, 1, 2, 3, 4, 5, 6
# AVG: the SUM, divided by ``scale`` (the number of contributions) before the
# one rounding; floating dtypes only. Division, not a multiply by 1/scale, so
# the result is the correctly rounded mean, as Gloo computes it.
AVG = 7

DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16",
          "int32", "int64", "uint8", "bool")

FLOAT_DTYPES = frozenset(("float32", "float64", "float16", "bfloat16"))


def supports(dtype: str, op: int) -> bool:
    """True if the kernel of dtype implements op (bitwise ops: integer/bool only)."""
    if dtype not in DTYPES:
        return False
    if op in (SUM, PRODUCT, MIN, MAX):
        return True
    if op in (BAND, BOR, BXOR):
        return dtype not in FLOAT_DTYPES
    if op == AVG:
        return dtype in FLOAT_DTYPES
    return False
