"""The native kernel library: same results as Numba's JIT kernels, used without importing Numba,
and a working fallback when it cannot be built."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from shmcoll import kernel_abi, kernel_library, kernels
from tests import kernel_library_scenarios
from tests.harness import assert_job_passes, spawn

ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                         ctypes.c_int64, ctypes.c_int64, ctypes.c_double)
OPS = (kernel_abi.SUM, kernel_abi.PRODUCT, kernel_abi.MIN, kernel_abi.MAX, kernel_abi.BAND, kernel_abi.BOR,
       kernel_abi.BXOR, kernel_abi.AVG)


def _inputs(dtype: str, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    np_dtype = kernel_abi.DTYPE_BY_NAME[dtype].numpy
    shape = (k + 1, n + 3)  # rows padded: the row stride is not n
    if dtype == "bool":
        data = rng.integers(0, 2, size=shape).astype(np.bool_)
    elif dtype in ("float16", "bfloat16"):
        import torch

        values = torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(getattr(torch, dtype))
        data = values.view(torch.uint16).numpy().copy()
    elif np_dtype.kind == "f":
        data = rng.standard_normal(shape).astype(np_dtype)
    else:
        info = np.iinfo(np_dtype)
        data = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=np_dtype)
    return np.ascontiguousarray(data[0, :n]), data[1:]


@pytest.mark.parametrize("dtype", kernel_abi.DTYPES)
def test_library_matches_the_jit_kernels(dtype):
    kernel_library.warm()
    assert kernel_library.loaded_from() is not None, "the native library was not built here"
    call = ENTRY(kernel_library.entry_point(dtype))
    reference = kernels.reducer(dtype)
    for op in OPS:
        if not kernel_abi.supports(dtype, op):
            continue
        floating = kernel_abi.DTYPE_BY_NAME[dtype].nature == kernel_abi.FLOAT
        scale = 3.0 if op == kernel_abi.AVG else (0.5 if op == kernel_abi.SUM and floating else 1.0)
        for n, k in ((0, 1), (1, 1), (7, 2), (1000, 3), (5003, 1)):
            first, rows = _inputs(dtype, n, k, seed=n * 31 + k * 7 + op)
            expected = np.empty_like(first)
            reference(expected, first, rows[:, :n], op, scale)
            got = np.empty_like(first)
            call(got.ctypes.data, first.ctypes.data, rows.ctypes.data, k, rows.shape[1], n, op, scale)
            np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8),
                                          err_msg=f"{dtype} op {op} n={n} k={k}")


@pytest.mark.parametrize("source", ["kernels.py", "kernel_intrinsics.py", "kernel_abi.py"])
def test_a_changed_kernel_source_changes_the_library(source, tmp_path, monkeypatch):
    """The library's key hashes every file the kernels are compiled from: a change in any gets a new library."""
    here = os.path.dirname(kernel_library.__file__)
    for name in ("kernels.py", "kernel_intrinsics.py", "kernel_abi.py", "kernel_library.py"):
        with open(os.path.join(here, name), "rb") as f:
            (tmp_path / name).write_bytes(f.read())
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernel_library, "__file__", str(tmp_path / "kernel_library.py"))
    before = kernel_library.library_path()
    with open(tmp_path / source, "a") as f:
        f.write("# changed\n")
    assert kernel_library.library_path() != before


def test_a_warm_job_never_imports_numba():
    kernel_library.warm()  # the library exists before the job starts, as after `python -m shmcoll warm`
    result = spawn("tests.kernel_library_scenarios:no_numba_after_init", 2)
    assert_job_passes(result, min_cases=kernel_library_scenarios.no_numba_after_init_cases())


def test_without_a_compiler_the_jit_kernels_are_used(tmp_path):
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
        "import numpy as np, ctypes\n"
        "from shmcoll import kernel_library\n"
        "kernel_library.warm()\n"
        "assert kernel_library.loaded_from() is None\n"
        "f = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, *[ctypes.c_int64] * 4, ctypes.c_double)"
        "(kernel_library.entry_point('float32'))\n"
        "a = np.arange(5, dtype=np.float32); rows = np.ones((2, 5), np.float32); out = np.empty(5, np.float32)\n"
        "f(out.ctypes.data, a.ctypes.data, rows.ctypes.data, 2, 5, 5, 0, 1.0)\n"
        "print('sum', out.tolist())\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "CC": "/nonexistent/cc"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sum [2.0, 3.0, 4.0, 5.0, 6.0]" in out.stdout, out.stdout
    assert "using Numba's JIT kernels" in out.stdout, out.stdout
    assert not list(tmp_path.glob("kernels-*.so"))


def test_a_failed_build_is_recorded_and_tried_again_only_on_request(tmp_path):
    """A link that fails leaves <library>.failed; later processes fall back without compiling; `warm` retries."""
    warm = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
        "from shmcoll import kernel_library\n"
        "if sys.argv[1] == 'no-build':\n"
        "    def build(path): sys.exit('build() called although an earlier build failed')\n"
        "    kernel_library.build = build\n"
        "kernel_library.warm()\n"
        "print('loaded from', kernel_library.loaded_from())\n"
        "print('sum', kernel_library.entry_point('float32') > 0)\n"
    )
    failing = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "CC": "false"}  # found, and every link fails

    def run(*argv, env):
        out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    first = run("-c", warm, "build", env=failing)
    assert "linking the kernel library failed" in first and "loaded from None" in first, first
    [marker] = tmp_path.glob("kernels-*.so.failed")
    assert "linking the kernel library failed" in marker.read_text()
    assert not list(tmp_path.glob("kernels-*.so"))

    second = run("-c", warm, "no-build", env=failing)
    assert "an earlier build failed" in second and "loaded from None" in second, second

    info = run("-m", "shmcoll", "info", env=failing)
    assert "a build failed" in info, info

    fixed = {key: value for key, value in failing.items() if key != "CC"}
    third = run("-m", "shmcoll", "warm", env=fixed)
    assert str(tmp_path) in third, third
    assert list(tmp_path.glob("kernels-*.so")) and not list(tmp_path.glob("kernels-*.so.failed"))
