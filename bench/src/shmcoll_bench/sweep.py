#!/usr/bin/env python3
"""Interleaved latency / bandwidth sweep of torch.distributed CPU backends (shm vs gloo).

Run under torchrun, e.g.::

    torchrun --nproc_per_node=4 -m shmcoll_bench.sweep                    # shm vs gloo, full sweep
    torchrun --nproc_per_node=2 -m shmcoll_bench.sweep --quick            # smoke test (< 20 s)
    torchrun --nproc_per_node=2 -m shmcoll_bench.sweep --backends gloo,gloo --quick   # shm not used
    torchrun --nproc_per_node=4 -m shmcoll_bench.sweep --json results.json && \\
        python -m shmcoll_bench.plot results.json results.png

``python -m shmcoll_bench`` launches it, adds Open MPI (shmcoll_bench.mpi) and draws the plot;
the repository's bench/run.sh runs the same three modules.  The sweep ships inside the package,
not in the repository's bench/ (which holds the other benchmarks), so that an installed shmcoll
can measure the machine it is installed on.

This module is the command line and the order of the work.  What runs at a point and how its
result is checked is in shmcoll_bench.cases, how it is timed in shmcoll_bench.timing, and
what is printed and written in shmcoll_bench.report; shmcoll_bench.mpi reuses all three.

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

Exit status: 0 ok, 2 a backend could not be initialised, 3 correctness check failed
(tests/test_sweep.py plants a wrong result through tests/sweep_fault.py to check this).
Environment: SWEEP_DEBUG=1 prints tracebacks of backend initialisation failures.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import math
import os
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist

from shmcoll import _env

from shmcoll_bench import cases, report, results, timing
from shmcoll_bench.report import fmt_bytes

EXIT_BACKEND = 2
EXIT_MISMATCH = 3


# --------------------------------------------------------------------------- command line


def parse_bytes(text: str) -> int:
    """A byte size as SHMCOLL_* variables take one (``_env.parse_bytes``: 8, 4K, 64M, 1G), for argparse."""
    try:
        n = _env.parse_bytes(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad byte size {text!r} (e.g. 8, 4K, 64M, 1G)") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"byte size must be positive: {text!r}")
    return n


def parse_dtype(name: str) -> torch.dtype:
    aliases = {"fp32": "float32", "float": "float32", "bf16": "bfloat16",
               "fp16": "float16", "half": "float16", "fp64": "float64", "double": "float64"}
    name = aliases.get(name.strip().lower(), name.strip().lower())
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise argparse.ArgumentTypeError(f"unknown dtype {name!r}")
    return dt


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


def add_size_and_timing_arguments(p: argparse.ArgumentParser, ops: tuple = cases.ALL_OPS) -> None:
    """The options that choose what is measured and how long; shmcoll_bench.mpi takes the same
    ones, so both sweeps of one ``python -m shmcoll_bench`` measure identical points.  A benchmark
    of a single op (``ops``, e.g. bench/peer_deepspeed.py's all_reduce) gets no --ops option."""
    if len(ops) > 1:
        p.add_argument("--ops", default=",".join(ops), help="comma list (default: all four)")
    else:
        p.set_defaults(ops=ops[0])
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
    p.add_argument("--pin", action="store_true",
                   help="bind local rank r of n to the r-th of n shares of the CPUs in the affinity mask first "
                        "(CPU r mod (CPUs) where ranks outnumber them: which ranks share a core is then the same in "
                        "every run; shmcoll_bench.timing.pin)")
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
        if o not in cases.ALL_OPS:
            p.error(f"unknown op {o!r}; choose from {', '.join(cases.ALL_OPS)}")
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


# --------------------------------------------------------------------------- groups


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


class Ctrl:
    """Bookkeeping collectives over a dedicated gloo group (never timed): the ``ctrl`` through
    which shmcoll_bench.timing and shmcoll_bench.cases.check_point make the ranks agree."""

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
        cases.ALL_GATHER(out, t, group=self.group)
        return out.view(dist.get_world_size(), -1).tolist()


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


# --------------------------------------------------------------------------- main


def place_threads(args) -> None:
    """--pin and --threads for this rank, before any thread starts (threads inherit the binding), and one
    inter-op thread (torch refuses a second setting; the first stands)."""
    if args.pin:
        timing.pin(int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    torch.set_num_threads(args.threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)


def checked(measure, rank: int) -> int:
    """``measure()``'s exit status, or EXIT_MISMATCH once rank 0 has named the wrong result (cases.Mismatch)
    that stopped it on every rank."""
    try:
        return measure()
    except cases.Mismatch as e:
        if rank == 0:
            print(f"\nerror: {e}", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        return EXIT_MISMATCH
    except KeyboardInterrupt:
        return 130


def main(argv=None) -> int:
    args = parse_args(argv)
    place_threads(args)
    rank = int(os.environ.get("RANK", "0"))
    if "WORLD_SIZE" not in os.environ or "MASTER_ADDR" not in os.environ:
        print("error: run me under torchrun, e.g. "
              "torchrun --nproc_per_node=2 -m shmcoll_bench.sweep --quick", file=sys.stderr)
        return EXIT_BACKEND

    labels, groups, ctrl = init_groups(args, rank)
    return checked(lambda: run(args, labels, groups, ctrl), rank)


def run(args, labels, groups, ctrl) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = sys.stdout
    r0 = rank == 0
    nb = len(labels)
    ref_idx = labels.index("gloo") if "gloo" in labels else 0
    base = labels[0]

    machine = report.machine_info(world)
    memcpy = timing.measure_memcpy(ctrl, args.memcpy_bytes, args.memcpy_time)
    memcpy_gbps = statistics.mean(memcpy)
    if r0:
        report.write_header(out, machine, labels, args, memcpy, memcpy_gbps)

    rows = []
    t_start = time.perf_counter()
    for op in args.op_list:
        notes = []
        if r0:
            out.write(f"## {op}\n\n")
            table = report.point_table(labels, args.dtype_list, out)
        for dt in args.dtype_list:
            usable = [True] * nb
            na_reason = [None] * nb
            counts = list(dict.fromkeys(cases.counts_for(op, s, dt.itemsize, world) for s in args.sizes))
            for count in counts:
                nbytes = count * dt.itemsize
                case = cases.OpCase(op, count, dt, world, rank)
                salt = cases.point_salt(len(rows))
                raised, errors = cases.check_point(case, labels, groups, ctrl, ref_idx, salt, usable, args)
                for b in range(nb):
                    if raised[b]:
                        usable[b] = False
                        na_reason[b] = errors[b] or "raised on another rank"
                        notes.append(f"- {labels[b]} {op} {report.dtype_name(dt)} is n/a from "
                                     f"{fmt_bytes(nbytes)} on: {na_reason[b]}")

                bufs = [case.alloc() if usable[b] else None for b in range(nb)]
                fns = [case.fn(groups[b], *bufs[b]) if usable[b] else None for b in range(nb)]
                iters = [timing.calibrate(fns[b], ctrl, args.iters_time, args.warmup) if usable[b] else 0
                         for b in range(nb)]
                local = [[0.0] * args.rounds for _ in range(nb)]
                for r in range(args.rounds):
                    for b in range(nb):  # A, B, A, B, ...
                        if usable[b]:
                            local[b][r] = timing.timed_round(fns[b], ctrl, iters[b])
                flat = ctrl.max([v for per_b in local for v in per_b])  # max over ranks
                del bufs, fns

                busf = cases.BUSBW_FACTOR[op](world)
                point = {}
                for b in range(nb):
                    if usable[b]:
                        point[labels[b]] = report.measured(nbytes, flat[b * args.rounds:(b + 1) * args.rounds],
                                                           busf, iters[b])
                    else:
                        point[labels[b]] = {"status": "n/a", "reason": na_reason[b]}
                lat = [point[lb].get("lat_us") for lb in labels]
                ratios = {f"{labels[b]}/{base}": (lat[b] / lat[0] if lat[b] and lat[0] else None)
                          for b in range(1, nb)}
                row = {"op": op, "dtype": report.dtype_name(dt), "bytes": nbytes, "count": count,
                       "chunk_bytes": case.chunk * dt.itemsize, "busbw_factor": busf,
                       "results": point, "ratio": ratios}
                rows.append(row)
                if r0:
                    table.row(report.point_cells(row, labels))
        if r0:
            out.write("\n")
            if notes:
                out.write("\n".join(notes) + "\n\n")
            out.flush()

    summary = report.largest_vs_memcpy(rows, args.op_list, args.dtype_list, labels, memcpy_gbps)
    elapsed = time.perf_counter() - t_start

    if r0:
        report.write_summary(out, summary, labels, args.dtype_list, memcpy_gbps)
        out.write(f"\n(sweep took {elapsed:.1f} s)\n")
        out.flush()
        if args.json:
            results.save(report.document(args, machine, labels, labels[ref_idx], memcpy, memcpy_gbps,
                                         rows, summary, elapsed), args.json)
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
