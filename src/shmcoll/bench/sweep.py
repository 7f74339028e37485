#!/usr/bin/env python3
"""Interleaved latency / bandwidth sweep of torch.distributed CPU backends (shm vs gloo).

Run under torchrun, e.g.::

    torchrun --nproc_per_node=4 -m shmcoll.bench.sweep                    # shm vs gloo, full sweep
    torchrun --nproc_per_node=2 -m shmcoll.bench.sweep --quick            # smoke test (< 20 s)
    torchrun --nproc_per_node=2 -m shmcoll.bench.sweep --backends gloo,gloo --quick   # shm not used
    torchrun --nproc_per_node=4 -m shmcoll.bench.sweep --json results.json && \\
        python -m shmcoll.bench.plot results.json results.png

``bench/sweep.py`` in the repository runs this module (``torchrun ... bench/sweep.py``), and
``python -m shmcoll bench`` launches it, adds Open MPI (shmcoll.bench.mpi) and draws the plot.
The sweep ships inside the package, rather than only in the repository's bench/, so that an
installed shmcoll can measure the machine it is installed on.

The default process group uses the first backend of ``--backends``; every other backend gets
its own ``dist.new_group(backend=name)`` over all ranks.  A separate gloo group ("control
group") carries all the bookkeeping (barriers, iteration counts, timings, check flags), so
timed loops contain nothing but the collective under test.

Method, for every (op, dtype, size):

1. correctness: every backend runs the op once on the same deterministic inputs; each
   result is compared with the locally computed expected value and with the reference
   backend's (gloo's) result.  A mismatch beyond bf16 tolerance aborts the run (exit 3).
   A backend that raises (e.g. unsupported dtype) is shown as "n/a" for that op/dtype.
2. calibration: per backend, the collective is timed with 1, 10, 100, ... calls until a
   batch lasts a few ms; the per-call time is all-reduced (MAX) through the control group,
   so the iteration count of a round (~``--iters-time`` s) is identical on every rank.
3. rounds: A, B, A, B, ... (``--rounds`` each).  Each round = a short warm-up, a control
   barrier, then a tight loop of ``iters`` calls timed with perf_counter.
4. latency = median over rounds of (max over ranks of per-call time).

Sizes follow the nccl-tests convention: ``bytes`` is the size of the largest buffer a rank
holds for the op (all_reduce / broadcast: the tensor; all_gather_into_tensor: the output,
i.e. world_size x the per-rank input; reduce_scatter_tensor: the input, i.e. world_size x the
per-rank output).  algbw = bytes / time; busbw = algbw x (all_reduce: 2(n-1)/n,
all_gather / reduce_scatter: (n-1)/n, broadcast: 1).

Exit status: 0 ok, 2 a backend could not be initialised, 3 correctness check failed.
Environment: SWEEP_FAULT=<label> corrupts that backend's check result on the last rank (to test
the abort path); SWEEP_DEBUG=1 prints tracebacks of backend initialisation failures.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import socket
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist

EXIT_BACKEND = 2
EXIT_MISMATCH = 3

ALL_OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast")
BUSBW_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather_into_tensor": lambda n: (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
SHORT_OP = {
    "all_reduce": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "broadcast": "broadcast",
}
MAX_ITERS = 1_000_000
# Test hook: SWEEP_FAULT=<backend label> corrupts that backend's check result on the last
# rank, to exercise the mismatch path (exit 3).
_FAULT = os.environ.get("SWEEP_FAULT")

# torch >= 2.13 deprecates all_gather_into_tensor / reduce_scatter_tensor in favour of the
# *_single names (same semantics, same backend entry points: _allgather_base /
# _reduce_scatter_base); call the new names directly when present to skip the warning shim.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# --------------------------------------------------------------------------- helpers


class BenchError(Exception):
    """An error that every rank agreed on; carries the exit status."""

    def __init__(self, msg: str, code: int):
        super().__init__(msg)
        self.code = code


def parse_bytes(text: str) -> int:
    s = text.strip().lower().replace("_", "")
    for suffix in ("ib", "b"):
        if s.endswith(suffix) and len(s) > len(suffix):
            s = s[: -len(suffix)]
            break
    mult = 1
    if s and s[-1] in "kmgt":
        mult = 1024 ** ("kmgt".index(s[-1]) + 1)
        s = s[:-1]
    try:
        value = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad byte size {text!r} (e.g. 8, 4K, 64M, 1G)")
    n = int(value * mult)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"byte size must be positive: {text!r}")
    return n


def fmt_bytes(n: int) -> str:
    """Exact: '64 MiB', '1.5 KiB', or plain bytes ('1048572 B') when no unit divides evenly."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and (n * 4) % scale == 0:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:g} {unit}"
    return f"{n} B"


def fmt_us(sec: float | None) -> str:
    if sec is None:
        return "n/a"
    us = sec * 1e6
    if us >= 100:
        return f"{us:.0f}"
    if us >= 10:
        return f"{us:.1f}"
    return f"{us:.2f}"


def fmt_gbps(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.2f}"
    if v >= 0.01:
        return f"{v:.3f}"
    return f"{v:.1e}" if v > 0 else "0"


def parse_dtype(name: str) -> torch.dtype:
    aliases = {"fp32": "float32", "float": "float32", "bf16": "bfloat16",
               "fp16": "float16", "half": "float16", "fp64": "float64", "double": "float64"}
    name = aliases.get(name.strip().lower(), name.strip().lower())
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise argparse.ArgumentTypeError(f"unknown dtype {name!r}")
    return dt


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def machine_info(world: int) -> dict:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gib = int(line.split()[1]) / (1 << 20)
                    break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {
        "cpu_model": cpu,
        "logical_cpus": os.cpu_count(),
        "cpus_in_affinity": affinity,
        "memory_gib": round(mem_gib, 1) if mem_gib else None,
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "world_size": world,
        "torch_threads_per_rank": torch.get_num_threads(),
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


# --------------------------------------------------------------------------- control plane


class Ctrl:
    """Bookkeeping collectives over a dedicated gloo group (never timed)."""

    def __init__(self, group):
        self.group = group

    def barrier(self) -> None:
        t = torch.zeros(1)
        dist.all_reduce(t, group=self.group)

    def max(self, values):
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t.tolist()

    def gather_all(self, values):
        t = torch.tensor(values, dtype=torch.float64)
        out = torch.empty(dist.get_world_size() * t.numel(), dtype=torch.float64)
        _ALL_GATHER(out, t, group=self.group)
        return out.view(dist.get_world_size(), -1).tolist()


# --------------------------------------------------------------------------- ops


def counts_for(op: str, nbytes: int, elsize: int, world: int) -> int:
    """Element count of the op's big buffer for a nominal size (nccl-tests 'size')."""
    count = max(1, nbytes // elsize)
    if op in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        count = max(world, count - count % world)
    return count


def make_input(rank: int, count: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    """Deterministic rank-dependent data: k/64 with k in [-64, 64] (exact in bf16/fp16)."""
    i = torch.arange(count, dtype=torch.int64)
    k = (i * 31 + rank * 17 + salt) % 129 - 64
    if dtype.is_floating_point or dtype.is_complex:
        return (k.to(torch.float32) / 64).to(dtype)
    return k.to(dtype)


class OpCase:
    """Buffers and the callable for one (op, dtype, count) on one group."""

    def __init__(self, op: str, count: int, dtype: torch.dtype, world: int, rank: int):
        self.op, self.count, self.dtype, self.world, self.rank = op, count, dtype, world, rank
        self.chunk = count // world if op in ("all_gather_into_tensor", "reduce_scatter_tensor") else count

    def alloc(self, fill_from: torch.Tensor | None = None):
        """Returns (inp, out); out is None for in-place ops.  Filled with ones unless fill_from.

        Not zeros: on the VM these numbers come from, copying zeros runs about 1.5x
        faster than copying anything else (all-gather 16 MiB: 1.3 ms against
        1.9 ms, the same tensors filled with ones), which flattered every backend.
        Summing ones repeatedly overflows to inf, which costs the same as any value.
        """
        op, dt = self.op, self.dtype
        if op in ("all_reduce", "broadcast"):
            inp = torch.empty(self.count, dtype=dt).fill_(1)
            out = None
        elif op == "all_gather_into_tensor":
            inp = torch.empty(self.chunk, dtype=dt).fill_(1)
            out = torch.empty(self.count, dtype=dt).fill_(1)
        else:  # reduce_scatter_tensor
            inp = torch.empty(self.count, dtype=dt).fill_(1)
            out = torch.empty(self.chunk, dtype=dt).fill_(1)
        if fill_from is not None:
            inp.copy_(fill_from)
        return inp, out

    def fn(self, group, inp, out):
        op = self.op
        if op == "all_reduce":
            return lambda: dist.all_reduce(inp, op=dist.ReduceOp.SUM, group=group)
        if op == "broadcast":
            return lambda: dist.broadcast(inp, src=0, group=group)
        if op == "all_gather_into_tensor":
            return lambda: _ALL_GATHER(out, inp, group=group)
        return lambda: _REDUCE_SCATTER(out, inp, op=dist.ReduceOp.SUM, group=group)

    def input_len(self) -> int:
        return self.chunk if self.op == "all_gather_into_tensor" else self.count

    def expected(self, salt: int) -> torch.Tensor:
        """The result this rank should hold, in float64 (computed locally)."""
        n, L = self.world, self.input_len()
        wide = _wide(self.dtype)
        if self.op == "broadcast":
            return make_input(0, L, self.dtype, salt).to(wide)
        if self.op == "all_gather_into_tensor":
            return torch.cat([make_input(r, L, self.dtype, salt).to(wide) for r in range(n)])
        acc = torch.zeros(L, dtype=wide)
        for r in range(n):
            acc += make_input(r, L, self.dtype, salt).to(wide)
        if self.op == "reduce_scatter_tensor":
            acc = acc[self.rank * self.chunk:(self.rank + 1) * self.chunk]
        return acc


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype.is_complex else torch.float64


def tolerance(dtype: torch.dtype, world: int):
    """(atol, rtol) for inputs bounded by 1 in magnitude: bf16-level, grows with #summands."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return 0.0, 0.0
    eps = 2.0 ** -8  # half a bf16 ulp at 1.0
    return world * world * eps, 2 * eps


def compare(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float):
    """Returns None if close, else a short description of the worst difference."""
    g = got.to(want.dtype)
    if g.shape != want.shape:
        return f"shape {tuple(g.shape)} != expected {tuple(want.shape)}"
    diff = (g - want).abs()
    bad = ~(diff <= atol + rtol * want.abs())  # also catches NaN
    if not bool(bad.any()):
        return None
    idx = int(bad.nonzero()[0, 0])
    return (f"{int(bad.sum())}/{bad.numel()} elements differ, max |diff| "
            f"{float(diff.nan_to_num(float('inf')).max()):.4g}; first at [{idx}]: "
            f"got {g[idx].item()!s:.12}, want {want[idx].item()!s:.12}")


# --------------------------------------------------------------------------- timing


def run_calls(fn, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return time.perf_counter() - t0


def calibrate(fn, ctrl: Ctrl, iters_time: float, warmup: int) -> int:
    """Collectively agreed iteration count so that one round lasts ~iters_time seconds."""
    for _ in range(warmup):
        fn()
    target = max(1e-3, min(0.02, iters_time / 4))
    n = 1
    while True:
        ctrl.barrier()
        t = ctrl.max([run_calls(fn, n)])[0]  # identical on every rank
        if t >= target or n >= MAX_ITERS // 10:
            break
        n *= 10
    per_call = max(t / n, 1e-9)
    iters = int(min(MAX_ITERS, max(1, round(iters_time / per_call))))
    return int(ctrl.max([iters])[0])  # belt and braces: every rank uses the same count


def timed_round(fn, ctrl: Ctrl, iters: int) -> float:
    for _ in range(max(1, min(50, iters // 10))):  # warm-up (caches, after the other backend)
        fn()
    ctrl.barrier()
    return run_calls(fn, iters) / iters


def measure_memcpy(ctrl: Ctrl, nbytes: int, seconds: float) -> list:
    """Copy bandwidth (GB/s, bytes copied per second, torch's threads) of every rank, measured
    while all ranks copy at the same time."""
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in
    dst.copy_(src)
    ctrl.barrier()
    n = 0
    t0 = time.perf_counter()
    while True:
        dst.copy_(src)
        n += 1
        el = time.perf_counter() - t0
        if el >= seconds and n >= 2:
            break
    gbps = n * nbytes / el / 1e9
    return [row[0] for row in ctrl.gather_all([gbps])]


# --------------------------------------------------------------------------- output


class Table:
    """Fixed-width Markdown table, printed row by row (rank 0 only)."""

    def __init__(self, headers, widths, out):
        self.widths = [max(w, len(h)) for h, w in zip(headers, widths)]
        self.out = out
        self._row(headers)
        self.out.write("|" + "|".join("-" * (w + 1) + ":" if i > 1 else ":" + "-" * (w + 1)
                                      for i, w in enumerate(self.widths)) + "|\n")
        self.out.flush()

    def _row(self, cells):
        parts = []
        for i, (c, w) in enumerate(zip(cells, self.widths)):
            parts.append(f" {c:<{w}} " if i <= 1 else f" {c:>{w}} ")
        self.out.write("|" + "|".join(parts) + "|\n")

    def row(self, cells):
        self._row(cells)
        self.out.flush()


# --------------------------------------------------------------------------- main


def build_sizes(args) -> list:
    lo, hi = args.min_bytes, args.max_bytes
    if hi < lo:
        raise SystemExit(f"--max-bytes ({hi}) < --min-bytes ({lo})")
    if args.quick:
        # 4 powers of two spread evenly (in log space) over [lo, hi], ends included
        a, b = math.log2(lo), math.log2(hi)
        sizes = {lo, hi}
        for i in (1, 2):
            sizes.add(1 << int(round(a + (b - a) * i / 3)))
        return sorted(s for s in sizes if lo <= s <= hi)
    sizes, s = [], lo
    while s < hi:
        sizes.append(s)
        s *= args.step
    sizes.append(hi)
    return sorted(set(sizes))


def add_size_and_timing_arguments(p: argparse.ArgumentParser) -> None:
    """The options that choose what is measured and how long; shmcoll.bench.mpi takes the same
    ones, so both sweeps of one ``python -m shmcoll bench`` measure identical points."""
    p.add_argument("--ops", default=",".join(ALL_OPS), help="comma list (default: all four)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma list (default: float32,bfloat16)")
    p.add_argument("--min-bytes", type=parse_bytes, default=None, help="smallest size (default 8)")
    p.add_argument("--max-bytes", type=parse_bytes, default=None,
                   help="largest size (default 64M; 1M with --quick)")
    p.add_argument("--step", type=int, default=4, choices=(2, 4, 8, 16),
                   help="size multiplier between points (default 4; the max is always included)")
    p.add_argument("--iters-time", type=float, default=None,
                   help="target seconds per timed round (default 0.2; 0.02 with --quick)")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds per backend (default 5; 3 with --quick)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls before calibration")
    p.add_argument("--json", metavar="PATH", help="write machine, memcpy GB/s and all rows here")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 4 sizes (8 B..1 MiB), 3 rounds of ~20 ms, short memcpy")


def resolve_size_and_timing_arguments(p: argparse.ArgumentParser, args) -> None:
    """Fills the defaults that depend on --quick and parses the lists (args.op_list,
    args.dtype_list, args.sizes)."""
    args.min_bytes = args.min_bytes or 8
    if args.max_bytes is None:
        args.max_bytes = max(args.min_bytes, (1 << 20) if args.quick else (64 << 20))
    if args.iters_time is None:
        args.iters_time = 0.02 if args.quick else 0.2
    if args.rounds is None:
        args.rounds = 3 if args.quick else 5
    args.rounds = max(1, args.rounds)
    args.op_list = [o.strip() for o in args.ops.split(",") if o.strip()]
    for o in args.op_list:
        if o not in ALL_OPS:
            p.error(f"unknown op {o!r}; choose from {', '.join(ALL_OPS)}")
    try:
        args.dtype_list = [parse_dtype(d) for d in args.dtypes.split(",") if d.strip()]
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    args.sizes = build_sizes(args)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="shm,gloo",
                   help="comma list; the first one backs the default group (default: shm,gloo). "
                        "A name may repeat (e.g. gloo,gloo) to test the script without shm.")
    add_size_and_timing_arguments(p)
    p.add_argument("--memcpy-bytes", type=parse_bytes, default=64 << 20,
                   help="buffer size of the memcpy ceiling measurement (default 64M)")
    p.add_argument("--memcpy-time", type=float, default=None,
                   help="seconds of the memcpy measurement (default 0.5; 0.1 with --quick)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per rank (default 1), set before the groups are made: shm splits large "
                        "messages over as many (see SHMCOLL_THREADS), and the memcpy ceiling copies with them")
    p.add_argument("--no-check", action="store_true", help="skip the correctness spot checks")
    p.add_argument("--timeout", type=float, default=600, help="process-group timeout, seconds")
    args = p.parse_args(argv)

    resolve_size_and_timing_arguments(p, args)
    if args.memcpy_time is None:
        args.memcpy_time = 0.1 if args.quick else 0.5
    args.backend_names = [b.strip().lower() for b in args.backends.split(",") if b.strip()]
    if not args.backend_names:
        p.error("--backends is empty")
    return args


def ensure_registered(name: str, rank: int) -> None:
    """Checks that a backend name is known to torch.distributed; exits 2 if not."""
    if name in dist.Backend.backend_list:
        return
    if name == "shm":
        # The shmcoll package registers "shm" from a `torch.backends` entry point at
        # `import torch`.  If autoloading is off (TORCH_DEVICE_BACKEND_AUTOLOAD=0) or the
        # entry point is broken, try the package directly.
        reason = "no torch.backends entry point of shmcoll is installed"
        try:
            from importlib.metadata import entry_points

            for ep in entry_points(group="torch.backends"):
                if ep.value.split(":")[0].split(".")[0] == "shmcoll":
                    ep.load()()
            if name not in dist.Backend.backend_list:
                import shmcoll  # noqa: F401  (in case importing the package registers it)
                if name not in dist.Backend.backend_list:
                    reason = "the shmcoll entry point / import did not register it"
        except Exception as e:  # not installed / broken build
            reason = f"{type(e).__name__}: {e}"
        else:
            if name in dist.Backend.backend_list:
                if rank == 0:
                    print("warning: 'shm' was not registered at `import torch` (is "
                          "TORCH_DEVICE_BACKEND_AUTOLOAD=0?); registered it via shmcoll's entry "
                          "point", file=sys.stderr)
                return
        if rank == 0:
            print(f"error: the 'shm' torch.distributed backend is not available ({reason}).\n"
                  "  Install the shmcoll package (e.g. `pip install -e .` in the repo) so that its\n"
                  "  torch.backends entry point registers it, or benchmark other backends only,\n"
                  "  e.g. --backends gloo  (or --backends gloo,gloo to exercise the comparison).",
                  file=sys.stderr)
        raise SystemExit(EXIT_BACKEND)
    if rank == 0:
        print(f"error: unknown torch.distributed backend {name!r} "
              f"(known: {', '.join(dist.Backend.backend_list)})", file=sys.stderr)
    raise SystemExit(EXIT_BACKEND)


def init_groups(args, rank: int):
    """Returns (labels, groups, ctrl).  Exits 2 if a backend cannot be set up."""
    for name in dict.fromkeys(args.backend_names + ["gloo"]):
        ensure_registered(name, rank)
    timeout = _dt.timedelta(seconds=args.timeout)
    names = args.backend_names
    labels, seen = [], {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        labels.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    stage = f"init_process_group(backend={names[0]!r})"
    try:
        dist.init_process_group(backend=names[0], timeout=timeout)
        groups = [dist.group.WORLD]
        for name in names[1:]:
            stage = f"new_group(backend={name!r})"
            groups.append(dist.new_group(backend=name, timeout=timeout))
        stage = "new_group(backend='gloo') for the control group"
        ctrl = Ctrl(dist.new_group(backend="gloo", timeout=timeout))
        stage = "first control barrier"
        ctrl.barrier()
    except Exception as e:
        print(f"error (rank {rank}): {stage} failed: {type(e).__name__}: {e}", file=sys.stderr)
        if os.environ.get("SWEEP_DEBUG"):
            traceback.print_exc()
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass
        raise SystemExit(EXIT_BACKEND)
    return labels, groups, ctrl


def check_point(case: OpCase, labels, groups, ctrl, ref_idx, salt, usable, args):
    """Runs the op once per usable backend on identical inputs; compares with the expected
    value and with the reference backend.  Returns per-backend error strings (None = ok) for
    backends that raised; raises BenchError on a wrong result (agreed by all ranks)."""
    rank = case.rank
    nb = len(labels)
    src = make_input(rank, case.input_len(), case.dtype, salt)
    results, errors, inputs = [None] * nb, [None] * nb, [None] * nb
    for b in range(nb):
        if not usable[b]:
            continue
        inp, out = case.alloc(fill_from=src)
        try:
            case.fn(groups[b], inp, out)()
            results[b] = out if out is not None else inp
            inputs[b] = inp if out is not None else None
            if _FAULT == labels[b] and rank == case.world - 1:  # test hook, see docstring
                results[b].view(-1)[-1] += 1
        except Exception as e:  # e.g. dtype unsupported by this backend
            errors[b] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
    failed = ctrl.max([1.0 if errors[b] else 0.0 for b in range(nb)])
    raised = [bool(f) and usable[b] for b, f in enumerate(failed)]
    if args.no_check:
        return raised, errors
    want = case.expected(salt)
    atol, rtol = tolerance(case.dtype, case.world)
    bad = [0.0] * (2 * nb)
    msgs = []
    ref = results[ref_idx] if usable[ref_idx] and not raised[ref_idx] else None
    for b in range(nb):
        if not usable[b] or raised[b]:
            continue
        d = compare(results[b], want, atol, rtol)
        if d:
            bad[b] = 1.0
            msgs.append(f"{labels[b]} vs expected: {d}")
        if inputs[b] is not None and not torch.equal(inputs[b], src):
            bad[b] = 1.0
            msgs.append(f"{labels[b]} modified its (out-of-place) input tensor")
        if ref is not None and b != ref_idx:
            d = compare(results[b], ref.to(want.dtype), atol, rtol)
            if d:
                bad[nb + b] = 1.0
                msgs.append(f"{labels[b]} vs {labels[ref_idx]}: {d}")
    agreed = ctrl.max(bad)
    if any(agreed):
        where = f"{case.op} {dtype_name(case.dtype)} {case.count * case.dtype.itemsize} bytes"
        for m in msgs:
            print(f"MISMATCH (rank {rank}) {where}: {m}", file=sys.stderr, flush=True)
        culprits = sorted({labels[b % nb] for b, f in enumerate(agreed) if f})
        raise BenchError(
            f"correctness check failed for {where} (atol {atol:g}, rtol {rtol:g}); "
            f"backend(s) {', '.join(culprits)} disagree with the expected result"
            + (f" / with {labels[ref_idx]}" if any(agreed[nb:]) else "")
            + " — see MISMATCH lines on stderr", EXIT_MISMATCH)
    return raised, errors


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    rank = int(os.environ.get("RANK", "0"))
    if "WORLD_SIZE" not in os.environ or "MASTER_ADDR" not in os.environ:
        print("error: run me under torchrun, e.g. "
              "torchrun --nproc_per_node=2 -m shmcoll.bench.sweep --quick", file=sys.stderr)
        return EXIT_BACKEND

    labels, groups, ctrl = init_groups(args, rank)
    try:
        return run(args, labels, groups, ctrl)
    except BenchError as e:
        if rank == 0:
            print(f"\nerror: {e}", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        return e.code
    except KeyboardInterrupt:
        return 130


def run(args, labels, groups, ctrl) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = sys.stdout
    r0 = rank == 0
    nb = len(labels)
    ref_idx = labels.index("gloo") if "gloo" in labels else 0
    base = labels[0]

    machine = machine_info(world)
    memcpy = measure_memcpy(ctrl, args.memcpy_bytes, args.memcpy_time)
    memcpy_gbps = statistics.mean(memcpy)

    if r0:
        m = machine
        out.write("# shmcoll sweep\n\n")
        out.write(f"- date: {m['date']}, host {m['hostname']}, kernel {m['kernel']}\n")
        out.write(f"- CPU: {m['cpu_model']}, {m['logical_cpus']} logical CPUs "
                  f"({m['cpus_in_affinity']} in affinity mask), memory {m['memory_gib']} GiB\n")
        out.write(f"- torch {m['torch']}, Python {m['python']}, world size {world}, "
                  f"{m['torch_threads_per_rank']} torch thread per rank\n")
        out.write(f"- backends: {labels[0]} (default group)"
                  + "".join(f", {lb} (new_group)" for lb in labels[1:])
                  + "; bookkeeping on a separate gloo group\n")
        out.write(f"- method: {args.rounds} interleaved rounds per backend of ~{args.iters_time:g} s; "
                  f"latency = median over rounds of the slowest rank's time per call; "
                  f"bytes = nccl-tests size (all_gather: output, reduce_scatter: input)\n")
        out.write(f"- memcpy ceiling (torch copy_, {args.threads} thread(s), {fmt_bytes(args.memcpy_bytes)}, "
                  f"all {world} ranks at once): {memcpy_gbps:.2f} GB/s per rank, mean "
                  f"(ranks: {', '.join(f'{v:.2f}' for v in memcpy)}; sum {sum(memcpy):.2f})\n\n")
        out.flush()

    headers = ["op", "dtype", "bytes"]
    headers += [f"{lb} us" for lb in labels]
    headers += [f"{lb} algbw GB/s" for lb in labels]
    headers += [f"{lb} busbw GB/s" for lb in labels]
    headers += [f"{lb}/{base} x" for lb in labels[1:]]
    dtw = max([8] + [len(dtype_name(d)) for d in args.dtype_list])
    widths = [14, dtw, 9] + [9] * nb + [6] * (2 * nb) + [6] * (nb - 1)

    rows = []
    t_start = time.perf_counter()
    for op in args.op_list:
        notes = []
        if r0:
            out.write(f"## {op}\n\n")
            table = Table(headers, widths, out)
        for dt in args.dtype_list:
            usable = [True] * nb
            na_reason = [None] * nb
            counts = list(dict.fromkeys(counts_for(op, s, dt.itemsize, world) for s in args.sizes))
            for count in counts:
                nbytes = count * dt.itemsize
                case = OpCase(op, count, dt, world, rank)
                salt = (len(rows) * 7 + 3) % 129
                raised, errors = check_point(case, labels, groups, ctrl, ref_idx, salt, usable, args)
                for b in range(nb):
                    if raised[b]:
                        usable[b] = False
                        na_reason[b] = errors[b] or "raised on another rank"
                        notes.append(f"- {labels[b]} {op} {dtype_name(dt)} is n/a from "
                                     f"{fmt_bytes(nbytes)} on: {na_reason[b]}")

                bufs = [case.alloc() if usable[b] else None for b in range(nb)]
                fns = [case.fn(groups[b], *bufs[b]) if usable[b] else None for b in range(nb)]
                iters = [calibrate(fns[b], ctrl, args.iters_time, args.warmup) if usable[b] else 0
                         for b in range(nb)]
                local = [[0.0] * args.rounds for _ in range(nb)]
                for r in range(args.rounds):
                    for b in range(nb):  # A, B, A, B, ...
                        if usable[b]:
                            local[b][r] = timed_round(fns[b], ctrl, iters[b])
                flat = ctrl.max([v for per_b in local for v in per_b])  # max over ranks
                del bufs, fns

                busf = BUSBW_FACTOR[op](world)
                results, lat = {}, [None] * nb
                for b in range(nb):
                    if not usable[b]:
                        results[labels[b]] = {"status": "n/a", "reason": na_reason[b]}
                        continue
                    rounds_s = flat[b * args.rounds:(b + 1) * args.rounds]
                    lat[b] = statistics.median(rounds_s)
                    algbw = nbytes / lat[b] / 1e9
                    results[labels[b]] = {
                        "status": "ok", "lat_us": lat[b] * 1e6, "min_us": min(rounds_s) * 1e6,
                        "algbw_gbps": algbw, "busbw_gbps": algbw * busf, "iters": iters[b],
                        "rounds_us": [v * 1e6 for v in rounds_s],
                    }
                ratios = {f"{labels[b]}/{base}": (lat[b] / lat[0] if lat[b] and lat[0] else None)
                          for b in range(1, nb)}
                row = {"op": op, "dtype": dtype_name(dt), "bytes": nbytes, "count": count,
                       "chunk_bytes": case.chunk * dt.itemsize, "busbw_factor": busf,
                       "results": results, "ratio": ratios}
                rows.append(row)
                if r0:
                    cells = [SHORT_OP[op], dtype_name(dt), fmt_bytes(nbytes)]
                    cells += [fmt_us(lat[b]) for b in range(nb)]
                    cells += [fmt_gbps(results[lb].get("algbw_gbps")) for lb in labels]
                    cells += [fmt_gbps(results[lb].get("busbw_gbps")) for lb in labels]
                    cells += ["n/a" if v is None else f"{v:.2f}" for v in ratios.values()]
                    table.row(cells)
        if r0:
            out.write("\n")
            if notes:
                out.write("\n".join(notes) + "\n\n")
            out.flush()

    # Summary: busbw at the largest size as % of the memcpy ceiling.
    summary = []
    for op in args.op_list:
        for dt in args.dtype_list:
            cand = [r for r in rows if r["op"] == op and r["dtype"] == dtype_name(dt)]
            if not cand:
                continue
            big = max(cand, key=lambda r: r["bytes"])
            ent = {"op": op, "dtype": big["dtype"], "bytes": big["bytes"], "busbw_gbps": {},
                   "pct_of_memcpy": {}}
            for lb in labels:
                v = big["results"][lb].get("busbw_gbps")
                ent["busbw_gbps"][lb] = v
                ent["pct_of_memcpy"][lb] = (100.0 * v / memcpy_gbps) if v is not None else None
            summary.append(ent)
    elapsed = time.perf_counter() - t_start

    if r0:
        out.write(f"## busbw at the largest size vs memcpy ceiling ({memcpy_gbps:.2f} GB/s per rank)\n\n")
        sh = ["op", "dtype", "bytes"] + [f"{lb} busbw GB/s" for lb in labels] + \
             [f"{lb} % memcpy" for lb in labels]
        st = Table(sh, [14, dtw, 9] + [6] * (2 * nb), out)
        for ent in summary:
            st.row([SHORT_OP[ent["op"]], ent["dtype"], fmt_bytes(ent["bytes"])]
                   + [fmt_gbps(ent["busbw_gbps"][lb]) for lb in labels]
                   + ["n/a" if ent["pct_of_memcpy"][lb] is None else f"{ent['pct_of_memcpy'][lb]:.0f}%"
                      for lb in labels])
        out.write(f"\n(sweep took {elapsed:.1f} s)\n")
        out.flush()
        if args.json:
            doc = {
                "machine": machine,
                "config": {
                    "backends": labels, "backend_names": args.backend_names,
                    "default_backend": args.backend_names[0], "reference_backend": labels[ref_idx],
                    "ops": args.op_list, "dtypes": [dtype_name(d) for d in args.dtype_list],
                    "sizes": args.sizes, "iters_time_s": args.iters_time, "rounds": args.rounds,
                    "warmup": args.warmup, "quick": args.quick, "checked": not args.no_check,
                    "size_convention": "nccl-tests: all_gather bytes = output, reduce_scatter bytes = input",
                    "latency": "median over rounds of max over ranks of per-call time",
                },
                "memcpy_gbps": memcpy_gbps,
                "memcpy_gbps_per_rank": memcpy,
                "memcpy_gbps_sum": sum(memcpy),
                "memcpy_method": f"torch copy_ of a uint8 buffer, {args.threads} thread(s), all ranks at once; "
                                 "GB/s = bytes copied / s (1e9); memcpy_gbps = mean over ranks",
                "memcpy_bytes": args.memcpy_bytes,
                "rows": rows,
                "largest_size_busbw_vs_memcpy": summary,
                "elapsed_s": elapsed,
            }
            tmp = args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(tmp, args.json)
            print(f"wrote {args.json}", file=sys.stderr)

    ctrl.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        code = 1
    sys.exit(code)
