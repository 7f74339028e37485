#!/usr/bin/env python
"""Benchmark shmcoll.kernels reductions against single-thread memcpy.

    python bench/bench_kernels.py [--json out.json] [--quick]

For each size (bytes of ONE array: 4 KiB .. 64 MiB) it prints the bandwidth
of ``np.copyto`` (bytes read + written per second = 2 * size / t) and of the
SUM kernel for float32 / bfloat16 / float16 with k = 1 and k = 3 rows
(bytes read + written = (k + 2) * size / t: ``first`` + k rows read, ``out``
written), and the ratio kernel / memcpy.  ``rows`` is a strided view of a
bigger buffer, as in the collectives; ``out`` is a separate buffer.  The
time is the best of several batches of calls, each batch >= ~20 ms.
It also prints the per-call time of an n = 2 reduction called from Python.
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

from shmcoll import kernels as K

KiB = 1024
MiB = 1024 * KiB


def machine():
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    fl = set(line.split(":", 1)[1].split())
                    flags = " ".join(x for x in ("avx2", "f16c", "avx512f", "avx512_bf16") if x in fl)
                    break
    except OSError:
        pass
    caches = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for idx in sorted(os.listdir(base)):
            d = os.path.join(base, idx)

            def rd(name, d=d):
                with open(os.path.join(d, name)) as f:
                    return f.read().strip()
            kind = rd("type")
            if kind == "Instruction":
                continue
            caches.append(f"L{rd('level')}{'d' if kind == 'Data' else ''} {rd('size')}")
    except OSError:
        pass
    import numba
    return {
        "caches": ", ".join(caches),
        "cpu": model,
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "flags": flags,
        "llvm_cpu": numba.config.CPU_NAME or __import__("llvmlite.binding", fromlist=["x"]).get_host_cpu_name(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
    }


def calibrate(fn, min_batch_s):
    """Calls per batch so that one batch takes about min_batch_s."""
    fn()  # warm up (page faults, caches)
    reps = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_batch_s or reps >= 1 << 20:
            return reps
        reps = max(reps * 2, int(reps * min_batch_s / max(dt, 1e-9) * 1.2))


def interleaved_best(configs, rounds=9, min_batch_s=0.01, budget_s=4.0):
    """Best time per call of each fn in configs ({name: fn}).

    The configs are timed in turn, round after round, so that the copy
    reference and the kernels see the same machine conditions (other
    processes may be running); the best batch of each is kept.
    """
    reps = {name: calibrate(fn, min_batch_s) for name, fn in configs.items()}
    best = {name: float("inf") for name in configs}
    t_start = time.perf_counter()
    for i in range(rounds):
        for name, fn in configs.items():
            r = reps[name]
            t0 = time.perf_counter()
            for _ in range(r):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / r)
        if i >= 2 and time.perf_counter() - t_start > budget_s:
            break
    return best


def page_aligned(shape, dtype):
    """Empty array whose data starts on a 4 KiB boundary (like shm buffers);
    malloc placement would otherwise make the results depend on the
    relative addresses of the buffers (4K aliasing, rep movsb quirks)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 4096, np.uint8)
    start = (-raw.ctypes.data) % 4096
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def fill(dtype_name, shape, rng):
    x = rng.standard_normal(shape, dtype=np.float32)
    if dtype_name == "float32":
        v = x
    elif dtype_name == "float16":
        v = x.astype(np.float16).view(np.uint16)
    elif dtype_name == "bfloat16":
        # round-to-nearest-even to bf16 bits
        u = x.view(np.uint32)
        v = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    else:
        raise ValueError(dtype_name)
    out = page_aligned(v.shape, v.dtype)
    out[...] = v
    return out


def bench_size(size, dtypes, ks, rng):
    src = page_aligned(size // 4, np.float32)
    src[...] = 1.0
    dst = page_aligned(size // 4, np.float32)
    dst[...] = 0.0
    configs = {
        "copyto": lambda: np.copyto(dst, src),
        # numpy's own copy loop; on some CPUs glibc's memcpy (rep movsb) is
        # much slower than this for L2-sized buffers, so the reference is the
        # faster of the two
        "assign": lambda: dst.__setitem__(Ellipsis, src),
    }
    moved = {"copyto": 2 * size, "assign": 2 * size}
    for dt in dtypes:
        kern = K.reducer(dt)
        item = 4 if dt == "float32" else 2
        n = size // item
        for k in ks:
            pad = 64
            big = fill(dt, (k, n + 2 * pad), rng)
            rows = big[:, pad:pad + n]
            first = fill(dt, n, rng)
            out = page_aligned(first.shape, first.dtype)
            out[...] = 0
            name = f"{dt}_k{k}"
            configs[name] = (lambda kern=kern, out=out, first=first, rows=rows:
                             kern(out, first, rows, K.SUM, 1.0))
            moved[name] = (k + 2) * size
    best = interleaved_best(configs)
    res = {"bytes": size}
    for name, t in best.items():
        res[f"{name}_GBps"] = moved[name] / t / 1e9
    memcpy = max(res["copyto_GBps"], res["assign_GBps"])
    res["memcpy_GBps"] = memcpy
    for dt in dtypes:
        for k in ks:
            res[f"{dt}_k{k}_ratio"] = res[f"{dt}_k{k}_GBps"] / memcpy
    return res


def call_overhead(dtype="float32", n=2, calls=100000):
    """Per-call time (s) of an n-element SUM from Python: rows as a strided
    view (exact signature match), rows as a C array (converted), and a numba
    no-op with the same arguments (the dispatcher's own floor)."""
    from numba import njit

    kern = K.reducer(dtype)
    npdt = np.uint16 if dtype in ("float16", "bfloat16") else np.dtype(dtype)
    big = np.ones((3, 16), npdt)
    rows_a = big[:1, 4:4 + n]
    rows_c = np.ones((1, n), npdt)
    first = np.ones(n, npdt)

    @njit(nogil=True)
    def noop(a, b, c, d, e):
        pass

    def per_call(fn, *args):
        fn(*args)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            best = min(best, (time.perf_counter() - t0) / calls)
        return best

    return {
        "strided_rows": per_call(kern, first, first, rows_a, K.SUM, 1.0),
        "c_rows": per_call(kern, first, first, rows_c, K.SUM, 1.0),
        "numba_noop": per_call(noop, first, first, rows_a, K.SUM, 1.0),
    }


def inplace_vs_separate(size, dtypes, rng):
    """k = 1 SUM GB/s with out separate and out aliasing first / a row."""
    res = {}
    for dt in dtypes:
        kern = K.reducer(dt)
        n = size // (4 if dt == "float32" else 2)
        big = fill(dt, (1, n + 128), rng)
        rows = big[:, 64:64 + n]
        first = fill(dt, n, rng)
        out = page_aligned(first.shape, first.dtype)
        out[...] = 0
        best = interleaved_best({
            "separate": lambda: kern(out, first, rows, K.SUM, 1.0),
            "out=first": lambda: kern(first, first, rows, K.SUM, 1.0),
            "out=row": lambda: kern(rows[0], first, rows, K.SUM, 1.0),
        }, rounds=5, budget_s=1.5)
        res[dt] = {name: 3 * size / t / 1e9 for name, t in best.items()}
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--json", help="write results to this file")
    ap.add_argument("--quick", action="store_true", help="fewer sizes (4K, 256K, 16M)")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--ks", default="1,3")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    for dtype in K.DTYPES:  # compile (or load from Numba's cache) every kernel before timing any
        K.reducer(dtype)
    warm_s = time.perf_counter() - t0

    info = machine()
    print(f"# shmcoll.kernels bench: {info['cpu']} ({info['cpus']} CPUs, "
          f"{info['affinity']} usable; {info['flags']}; llvm cpu {info['llvm_cpu']})")
    if info["caches"]:
        print(f"# caches: {info['caches']}")
    print(f"# python {info['python']}, numpy {info['numpy']}, numba {info['numba']}; "
          f"loading the kernels took {warm_s:.2f} s in this process")
    print("# GB/s = bytes read + written per second, single thread, size = bytes per array.")
    print("# copyto = np.copyto (glibc memcpy), assign = dst[...] = src (numpy copy loop);")
    print("# kernel: SUM, k rows + first read, out written (separate buffer);")
    print("# (ratio) = kernel GB/s / max(copyto, assign)")

    dtypes = args.dtypes.split(",")
    ks = [int(x) for x in args.ks.split(",")]
    if args.quick:
        sizes = [4 * KiB, 256 * KiB, 16 * MiB]
    else:
        sizes = [4 * KiB << (2 * i) for i in range(8)]  # 4K .. 64M

    short = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64"}
    cols = [f"{short.get(dt, dt)} k={k}" for dt in dtypes for k in ks]
    head = (f"{'size':>6} {'copyto':>7} {'assign':>7} | "
            + " | ".join(f"{c:>15}" for c in cols))
    print(head)
    print("-" * len(head))
    rng = np.random.default_rng(0)
    results = []
    for size in sizes:
        r = bench_size(size, dtypes, ks, rng)
        results.append(r)
        label = f"{size // MiB}M" if size >= MiB else f"{size // KiB}K"
        cells = []
        for dt in dtypes:
            for k in ks:
                cells.append(f"{r[f'{dt}_k{k}_GBps']:6.1f} ({r[f'{dt}_k{k}_ratio']:4.2f}x)")
        print(f"{label:>6} {r['copyto_GBps']:7.1f} {r['assign_GBps']:7.1f} | "
              + " | ".join(f"{c:>15}" for c in cells))
        sys.stdout.flush()

    ip_size = 256 * KiB
    ip = inplace_vs_separate(ip_size, dtypes, rng)
    print(f"# aliasing, {ip_size // KiB} KiB, k=1 SUM, GB/s: " + "; ".join(
        f"{dt} " + " ".join(f"{name} {v:.1f}" for name, v in r.items()) for dt, r in ip.items()))

    oh = {dt: call_overhead(dt) for dt in ("float32", "bfloat16")}
    for dt, o in oh.items():
        print(f"# per-call time from Python, {dt} SUM n=2 k=1 (out=first): "
              f"{o['strided_rows'] * 1e6:.2f} us with strided rows, "
              f"{o['c_rows'] * 1e6:.2f} us with C rows "
              f"(numba no-op with the same args: {o['numba_noop'] * 1e6:.2f} us)")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "warm_s": warm_s, "results": results,
                       "aliasing_GBps": {"bytes": ip_size, **ip},
                       "per_call_us": {dt: {k: v * 1e6 for k, v in o.items()}
                                       for dt, o in oh.items()}}, f, indent=2)


if __name__ == "__main__":
    main()
