#!/usr/bin/env python3
"""DeepSpeed's CPU shared-memory all_reduce beside shm and Gloo, in one interleaved job (BENCHMARKS.md,
"Threads per rank").

    .venv/bin/python -m pip install -e './bench[peers]'    # DeepSpeed, built from its sdist; torch is left as it is
    .venv/bin/torchrun --nproc_per_node=2 bench/peer_deepspeed.py --json results/peer-deepspeed-2ranks.json
    .venv/bin/torchrun --nproc_per_node=2 bench/peer_deepspeed.py --max-bytes 4M --rounds 3   # shorter

Three columns per (dtype, size): ``dist.all_reduce`` on the default group (shm), the same on a
``new_group(backend="gloo")`` over the same ranks, and ``deepspeed.comm.inference_all_reduce``, the call
DeepSpeed's CPU inference makes: a C++ op, compiled with the system C++ compiler and ninja on its first
use (a minute or more; cached under ~/.cache/torch_extensions after), that reduces through /dev/shm
buffers of its own.

DeepSpeed beside the shm default group: ``deepspeed.comm.init_distributed()`` finds torch.distributed
initialised and only wraps the default group (its TorchBackend skips init_process_group), builds the op
and calls its ``initialize(world, rank)``, which maps every rank's buffer.  The op itself uses no process
group, so the default group stays shm.  Three traps, each handled here rather than left to the user:

- ``DS_ACCELERATOR=cpu`` (set if unset): on a machine with a GPU DeepSpeed would pick CUDA and never
  build the CPU op.
- ``LOCAL_SIZE`` (set from torchrun's LOCAL_WORLD_SIZE if unset): the op initialises only when it equals
  the world size; otherwise its first call crashes with SIGSEGV.  A job over several nodes is refused.
- ``inference_all_reduce`` quietly falls back to ``dist.all_reduce`` on the default group, i.e. shm,
  where the CPU lacks the op's ISA (avx2 for float32, avx512bw for bfloat16/float16); and the op returns
  other dtypes unreduced.  Such a column is n/a, not shm timed under DeepSpeed's name.

Threads (``--threads N``, default 1): the op's OpenMP loops run in the calling thread on the runtime
torch loaded (the op links no OpenMP runtime of its own), so ``torch.set_num_threads(N)`` sets its team
as it sets shm's lanes and Gloo's; OMP_NUM_THREADS=N as well, for a runtime that would start later.  The
header lists the OpenMP runtimes mapped into the process: more than one would break that.

Method, as shmcoll_bench.sweep's: at every point each backend first all-reduces the same per-rank random
data (uniform in [-1, 1), seeded by rank and point), compared with the sum computed locally in float64
(exit 3 on a wrong result), and with shm's bit for bit (reported, not required: rounding may differ).
Then per backend an agreed iteration count (shmcoll_bench.timing.calibrate) and ``--rounds`` rounds, the
backends taking turns to go first (shm, gloo, deepspeed; gloo, deepspeed, shm; ...); latency = median
over rounds of the slowest rank's time per call.  Bookkeeping goes over a separate gloo group.

Exit status: 0 done, or DeepSpeed is not installed or the job spans nodes (one line says so: callers
treat this peer as optional); 2 a backend could not be set up; 3 a wrong result.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import sys
import time
import traceback

import torch
import torch.distributed as dist

from shmcoll_bench import cases, report, results, sweep, timing
from shmcoll_bench.report import dtype_name, fmt_bytes

OP = "all_reduce"
DEEPSPEED = "deepspeed"
# The dtypes the op reduces; it returns any other unreduced.
DEEPSPEED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_size_and_timing_arguments(p, ops=(OP,))
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per rank (default 1): shm's lanes and DeepSpeed's OpenMP team")
    p.add_argument("--timeout", type=float, default=600, help="process-group timeout, seconds")
    p.add_argument("--no-gloo", dest="gloo", action="store_false",
                   help="time shm and DeepSpeed only (Gloo's large points take most of a job's time)")
    args = p.parse_args(argv)
    sweep.resolve_size_and_timing_arguments(p, args)
    # sweep.init_groups: shm the default group, Gloo a new_group
    args.backend_names = ["shm", "gloo"] if args.gloo else ["shm"]
    return args


# --------------------------------------------------------------------------- DeepSpeed


def not_applicable() -> str | None:
    """Why this job cannot time DeepSpeed (one line), or None."""
    if importlib.util.find_spec("deepspeed") is None:
        return ("DeepSpeed is not installed (pip install -e './bench[peers]'): its shm all_reduce is not "
                "benchmarked; nothing to do")
    world, local = os.environ["WORLD_SIZE"], os.environ["LOCAL_SIZE"]
    if local != world:
        return (f"DeepSpeed's shm all_reduce needs every rank on one node (LOCAL_SIZE {local}, "
                f"WORLD_SIZE {world}): not benchmarked")
    return None


def openmp_runtimes() -> list[str]:
    """The OpenMP runtimes mapped into this process."""
    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and os.path.basename(parts[5]).startswith(("libgomp", "libiomp", "libomp")):
                found.add(parts[5])
    return sorted(found)


def ninja_on_path() -> None:
    """torch compiles DeepSpeed's op with the ``ninja`` on PATH; the ninja package (a DeepSpeed requirement)
    puts its binary beside the interpreter's scripts, which are not on PATH where the environment is not
    activated (``.venv/bin/torchrun``) or the package went in with ``pip --target``."""
    if shutil.which("ninja"):
        return
    with contextlib.suppress(ImportError):
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


class DeepSpeedAllReduce:
    """``deepspeed.comm.inference_all_reduce`` set up beside the shm default group."""

    def __init__(self, ctrl):
        ninja_on_path()
        # DeepSpeed logs to stdout and its op prints a line when built: keep stdout for the table.
        with contextlib.redirect_stdout(sys.stderr):
            import deepspeed
            import deepspeed.comm as ds_comm

            ds_comm.init_distributed(verbose=False)
        if dist.get_backend() != "shm":
            raise RuntimeError(f"DeepSpeed replaced the default group's backend by {dist.get_backend()!r}")
        # ``deepspeed.comm`` re-exports a copy of the module global taken at import (then None).
        backend = ds_comm.comm.cdb
        self.version = deepspeed.__version__
        self.call = ds_comm.inference_all_reduce
        self.op_loaded = hasattr(torch.ops, "deepspeed") and hasattr(torch.ops.deepspeed, "inference_all_reduce_")
        # 0 none, 1 avx2, 2 avx512bw (0.19.8 has this guard; None: a DeepSpeed without it, which always calls its op).
        self.kernel_level = getattr(backend, "shm_vector_kernel_level", None)
        # Once every rank has initialised, each has mapped every other's buffer and reset its own
        # buffer's state (one left by an earlier job on the same port is reused): no call may start
        # before.  DeepSpeed never unlinks its buffer (66 MiB per rank, left in /dev/shm by every job), so
        # each rank unlinks its own then: the mappings stay.
        ctrl.barrier()
        name = (f"deepspeed_allreduce_buffer_{os.getuid()}_{os.environ['MASTER_ADDR']}_"
                f"{os.environ['MASTER_PORT']}_{dist.get_rank()}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join("/dev/shm", name))

    def unusable(self, dtype: torch.dtype) -> str | None:
        """Why inference_all_reduce would not run DeepSpeed's op on ``dtype``, or None."""
        if not self.op_loaded:
            return "DeepSpeed's shm op is not loaded: inference_all_reduce would run dist.all_reduce on shm"
        if dtype not in DEEPSPEED_DTYPES:
            return "DeepSpeed's shm op returns this dtype unreduced"
        need = 1 if dtype == torch.float32 else 2
        if self.kernel_level is not None and self.kernel_level < need:
            return (f"the CPU lacks {'avx2' if need == 1 else 'avx512bw'}: inference_all_reduce would run "
                    "dist.all_reduce on shm")
        return None

    def describe(self) -> dict:
        return {"version": self.version, "call": "deepspeed.comm.inference_all_reduce",
                "kernel_level": self.kernel_level, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR"),
                "LOCAL_SIZE": os.environ.get("LOCAL_SIZE"), "openmp_runtimes": openmp_runtimes()}


# --------------------------------------------------------------------------- one point


def callers(groups, deepspeed: DeepSpeedAllReduce) -> dict:
    """label -> (tensor -> the call that all-reduces it in place)."""
    shm_group, *gloo_group = groups
    return {
        "shm": lambda t: lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM, group=shm_group),
        **({"gloo": lambda t: lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM, group=gloo_group[0])}
           if gloo_group else {}),
        DEEPSPEED: lambda t: lambda: deepspeed.call(t),
    }


def random_input(rank: int, count: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    """Rank ``rank``'s data at a point, uniform in [-1, 1) (cases.tolerance assumes |x| <= 1); any rank
    can make any rank's, so the reference is computed locally."""
    g = torch.Generator().manual_seed(1_000_003 * salt + rank)
    return (torch.rand(count, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)


def check_point(call, usable: dict, dtype, count: int, salt: int, ctrl) -> dict:
    """Every usable backend all-reduces this rank's random data once; each result is compared with the
    float64 sum of every rank's data (raises cases.Mismatch, agreed by all ranks, if one is wrong) and
    with shm's.  Returns label -> {"error"} for a backend that raised on some rank, else {"bitwise_equal"
    to shm on every rank, "max_abs_diff" to shm over ranks}."""
    rank, world = dist.get_rank(), dist.get_world_size()
    labels = [lb for lb in call if usable[lb] is None]
    got, errors = {}, {}
    for lb in labels:
        t = random_input(rank, count, dtype, salt)
        try:
            call[lb](t)()
            got[lb] = t
        except Exception as e:  # e.g. a dtype the backend does not take
            errors[lb] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
    raised = ctrl.max([1.0 if lb in errors else 0.0 for lb in labels])
    want = sum(random_input(r, count, dtype, salt).to(torch.float64) for r in range(world))
    atol, rtol = cases.tolerance(dtype, world)
    wrong, msgs, unequal, diff = [], [], [], []
    for lb in labels:
        d = cases.compare(got[lb], want, atol, rtol) if lb in got else None
        wrong.append(1.0 if d else 0.0)
        if d:
            msgs.append(f"{lb} vs expected: {d}")
        same = lb in got and "shm" in got and torch.equal(got[lb], got["shm"])
        unequal.append(0.0 if same else 1.0)
        diff.append(float((got[lb].to(torch.float64) - got["shm"].to(torch.float64)).abs().max())
                    if lb in got and "shm" in got else 0.0)
    agreed = ctrl.max(wrong + unequal + diff)
    n = len(labels)
    if any(agreed[:n]):
        where = f"{OP} {dtype_name(dtype)} {count * dtype.itemsize} bytes"
        for m in msgs:
            print(f"MISMATCH (rank {rank}) {where}: {m}", file=sys.stderr, flush=True)
        culprits = [lb for lb, bad in zip(labels, agreed[:n]) if bad]
        raise cases.Mismatch(f"correctness check failed for {where} (atol {atol:g}, rtol {rtol:g}); "
                             f"backend(s) {', '.join(culprits)} disagree with the expected result "
                             "— see MISMATCH lines on stderr")
    out = {}
    for i, lb in enumerate(labels):
        if raised[i]:
            out[lb] = {"error": errors.get(lb, "raised on another rank")}
        else:
            out[lb] = {"bitwise_equal": not agreed[n + i], "max_abs_diff": agreed[2 * n + i]}
    return out


def time_point(call, usable: dict, case: cases.OpCase, args, ctrl) -> dict:
    """label -> rounds (the slowest rank's time per call), for the usable backends."""
    labels = [lb for lb in call if usable[lb] is None]
    fns = {lb: call[lb](case.alloc()[0]) for lb in labels}
    iters = {lb: timing.calibrate(fns[lb], ctrl, args.iters_time, args.warmup) for lb in labels}
    local = {lb: [0.0] * args.rounds for lb in labels}
    for r in range(args.rounds):
        turn = r % len(labels)  # each backend goes first in turn: none always follows the same one
        for lb in labels[turn:] + labels[:turn]:
            local[lb][r] = timing.timed_round(fns[lb], ctrl, iters[lb])
    flat = ctrl.max([v for lb in labels for v in local[lb]])
    return {lb: (flat[i * args.rounds:(i + 1) * args.rounds], iters[lb]) for i, lb in enumerate(labels)}


# --------------------------------------------------------------------------- main


def write_header(out, machine: dict, ds: dict, args) -> None:
    m = machine
    out.write("# DeepSpeed peer: all_reduce on shm, Gloo and DeepSpeed's shm op\n\n")
    out.write(f"- date: {m['date']}, host {m['hostname']}, kernel {m['kernel']}\n")
    out.write(f"- CPU: {m['cpu_model']}, {m['logical_cpus']} logical CPUs ({m['cpus_in_affinity']} in affinity "
              f"mask), memory {m['memory_gib']} GiB\n")
    out.write(f"- torch {m['torch']}, Python {m['python']}, world size {m['world_size']}, "
              f"{m['torch_threads_per_rank']} torch thread(s) per rank\n")
    runtimes = ds["openmp_runtimes"]
    out.write(f"- DeepSpeed {ds['version']}: {ds['call']} (DS_ACCELERATOR={ds['DS_ACCELERATOR']}, "
              f"LOCAL_SIZE={ds['LOCAL_SIZE']}, kernel level {ds['kernel_level']}); OpenMP runtime"
              f"{'s' if len(runtimes) != 1 else ''}: {', '.join(runtimes) or 'none'}"
              + (" (more than one: DeepSpeed's threads may not follow --threads)" if len(runtimes) > 1 else "")
              + "\n")
    out.write(f"- backends: shm (default group), {'gloo (new_group), ' if args.gloo else ''}deepspeed (its op, no "
              "group); bookkeeping on a separate gloo group\n")
    out.write(f"- method: {args.rounds} rounds per backend of ~{args.iters_time:g} s, the backends taking turns "
              "to go first; latency = median over rounds of the slowest rank's time per call; results checked "
              f"against a local float64 sum first{report.pinning(args)}\n\n")
    out.flush()


def main(argv=None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    if "WORLD_SIZE" not in os.environ or "MASTER_ADDR" not in os.environ:
        print("error: run me under torchrun, e.g. torchrun --nproc_per_node=2 bench/peer_deepspeed.py --quick",
              file=sys.stderr)
        return sweep.EXIT_BACKEND
    # Before DeepSpeed is imported (it picks its accelerator then) and its op initialised (it reads LOCAL_SIZE).
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    reason = not_applicable()
    if reason:
        if rank == 0:
            print(reason)
        return 0
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    sweep.place_threads(args)

    _, groups, ctrl = sweep.init_groups(args, rank)
    try:
        if rank == 0:
            print("setting up DeepSpeed (its op is compiled on first use: a minute or more)", file=sys.stderr,
                  flush=True)
        deepspeed = DeepSpeedAllReduce(ctrl)
    except Exception as e:
        print(f"error (rank {rank}): DeepSpeed's set-up failed: {type(e).__name__}: {e}", file=sys.stderr)
        traceback.print_exc()
        return sweep.EXIT_BACKEND
    return sweep.checked(lambda: run(args, groups, ctrl, deepspeed), rank)


def run(args, groups, ctrl, deepspeed: DeepSpeedAllReduce) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    out, r0 = sys.stdout, rank == 0
    call = callers(groups, deepspeed)
    labels = list(call)
    machine = report.machine_info(world)
    ds = deepspeed.describe()
    if r0:
        write_header(out, machine, ds, args)
        out.write(f"## {OP}\n\n")
        table = report.point_table(labels, args.dtype_list, out)
    rows, notes = [], []
    t_start = time.perf_counter()
    busf = cases.BUSBW_FACTOR[OP](world)
    for dt in args.dtype_list:
        usable = {lb: None for lb in labels}
        usable[DEEPSPEED] = deepspeed.unusable(dt)
        if usable[DEEPSPEED]:
            notes.append(f"- deepspeed {dtype_name(dt)} is n/a: {usable[DEEPSPEED]}")
        for count in dict.fromkeys(cases.counts_for(OP, s, dt.itemsize, world) for s in args.sizes):
            nbytes = count * dt.itemsize
            checked = check_point(call, usable, dt, count, cases.point_salt(len(rows)), ctrl)
            for lb, c in checked.items():
                if "error" in c:
                    usable[lb] = c["error"]
                    notes.append(f"- {lb} {dtype_name(dt)} is n/a from {fmt_bytes(nbytes)} on: {c['error']}")
            timed = time_point(call, usable, cases.OpCase(OP, count, dt, world, rank), args, ctrl)
            point = {lb: report.measured(nbytes, timed[lb][0], busf, timed[lb][1]) if lb in timed
                     else {"status": "n/a", "reason": usable[lb]} for lb in labels}
            for lb, c in checked.items():
                if lb in timed and lb != "shm":
                    point[lb]["vs_shm"] = c
            lat = {lb: point[lb].get("lat_us") for lb in labels}
            row = {"op": OP, "dtype": dtype_name(dt), "bytes": nbytes, "count": count, "busbw_factor": busf,
                   "results": point,
                   "ratio": {f"{lb}/shm": lat[lb] / lat["shm"] if lat[lb] and lat["shm"] else None
                             for lb in labels[1:]}}
            rows.append(row)
            if r0:
                table.row(report.point_cells(row, labels))
    elapsed = time.perf_counter() - t_start
    if r0:
        out.write("\n" + "".join(n + "\n" for n in notes) + agreement_lines(rows, labels[1:]))
        out.write(f"\n(took {elapsed:.1f} s)\n")
        out.flush()
        if args.json:
            results.save(document(args, machine, ds, labels, rows, elapsed), args.json)
            print(f"wrote {args.json}", file=sys.stderr)
    ctrl.barrier()
    dist.destroy_process_group()
    return 0


def agreement_lines(rows: list[dict], others: list[str]) -> str:
    """How each backend's checked results compare with shm's, per dtype: rounding may differ."""
    lines = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for lb in others:
            seen = [r["results"][lb]["vs_shm"] for r in rows if r["dtype"] == dtype and "vs_shm" in r["results"][lb]]
            if seen:
                equal = sum(s["bitwise_equal"] for s in seen)
                lines.append(f"- {lb} {dtype} results bitwise equal to shm's at {equal} of {len(seen)} points"
                             + ("" if equal == len(seen) else
                                f" (max |diff| {max(s['max_abs_diff'] for s in seen):.3g})") + "\n")
    return "".join(lines)


def document(args, machine: dict, ds: dict, labels: list[str], rows: list[dict], elapsed: float) -> dict:
    """The JSON document: the layout of shmcoll_bench.sweep's, so that shmcoll_bench.plot draws it."""
    return {
        "machine": machine,
        "config": {
            "bench": "peer_deepspeed", "backends": labels, "default_backend": "shm", "deepspeed": ds,
            "ops": [OP], "dtypes": [dtype_name(d) for d in args.dtype_list], "sizes": args.sizes,
            "iters_time_s": args.iters_time, "rounds": args.rounds, "warmup": args.warmup,
            "order": f"rotated each round ({', '.join(labels)}; then each next first)",
            "threads": args.threads, "quick": args.quick, "checked": True, "pinned": args.pin,
            "input": "uniform [-1, 1) per rank and point, checked against a local float64 sum",
            **report.CONVENTIONS,
        },
        "rows": rows,
        "elapsed_s": elapsed,
    }


if __name__ == "__main__":
    sys.exit(main())
