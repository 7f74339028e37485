"""``python -m shmcoll_bench`` (or the ``shmcoll-bench`` script): shm against Gloo, and Open MPI if installed,
on N local ranks, without a torchrun line; one table row per point as it completes, then a JSON and a PNG.

The sweep of bench/run.sh (about 2 minutes at 2 ranks; --quick about 20 s), launched through torchrun, then
the same points on Open MPI (shmcoll_bench.mpi) as a job of its own, merged into one document and plot.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from shmcoll_bench import mpi as sweep_mpi, results as sweep_results

# The settings of bench/run.sh and BENCHMARKS.md: 8 B..64 MiB in x8 steps, 3 interleaved
# rounds of 0.1 s (about 2 minutes at 2 ranks); --quick is the sweep's own smoke test.
STANDARD_SWEEP = ["--step", "8", "--rounds", "3", "--iters-time", "0.1"]
QUICK_SWEEP = ["--quick"]


def compare(args) -> int:
    """Measure shm against gloo (and Open MPI, if installed) on N local ranks; JSON and PNG."""
    sweep_args = (QUICK_SWEEP if args.quick else STANDARD_SWEEP) + _passed_through(args.sweep_args)
    json_path = args.json or f"shmcoll-bench-{args.nproc}ranks.json"
    png_path = args.png or os.path.splitext(json_path)[0] + ".png"
    env = dict(os.environ, OMP_NUM_THREADS="1")  # what the sweep uses; also silences torchrun's notice
    with tempfile.TemporaryDirectory(prefix="shmcoll-bench-") as scratch:
        torch_json = os.path.join(scratch, "sweep.json")
        # --standalone: a free port of its own, so a concurrent torchrun job cannot collide.
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", str(args.nproc), "-m", "shmcoll_bench.sweep", *sweep_args, "--json", torch_json]
        print("+ " + " ".join(command), file=sys.stderr, flush=True)
        code = subprocess.call(command, env=env)  # the sweep prints one table row per point as it goes
        if code != 0 or not os.path.exists(torch_json):
            print(f"shmcoll-bench: the sweep failed (exit status {code})", file=sys.stderr)
            return code or 1
        docs = [sweep_results.load(torch_json)]

        if not args.no_mpi:
            mpi_json = os.path.join(scratch, "mpi.json")
            reason = sweep_mpi.unavailable_reason()
            if reason is None:
                command, mpi_env = sweep_mpi.launch_command(args.nproc, sweep_args + ["--json", mpi_json])
                print("\n+ " + " ".join(command), file=sys.stderr, flush=True)
                code = subprocess.call(command, env=mpi_env)
                if code == 0 and os.path.exists(mpi_json):
                    docs.append(sweep_results.load(mpi_json))
                else:
                    reason = f"the MPI sweep failed (exit status {code})"
            if reason:
                print(f"\nshmcoll-bench: no MPI comparison: {reason}", file=sys.stderr)

    doc = sweep_results.merge(docs)
    sweep_results.save(doc, json_path)
    if len(docs) > 1:
        print("\n## shm, gloo and MPI (the points MPI has)\n")
        sweep_results.print_comparison(doc, sys.stdout, only_with=sweep_mpi.LABEL)
    print(f"\nwrote {json_path}")
    try:
        from shmcoll_bench import plot as sweep_plot

        sweep_plot.plot(doc, png_path)
    except ImportError:
        print(f"no plot: matplotlib is not installed (pip install matplotlib, then "
              f"python -m shmcoll_bench.plot {json_path} {png_path})")
    else:
        print(f"wrote {png_path}")
    return 0


def _passed_through(extra: list[str]) -> list[str]:
    """The arguments after ``--``, for the sweeps (argparse may keep the separator)."""
    return extra[1:] if extra[:1] == ["--"] else extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shmcoll_bench", description=__doc__ + "\nArguments after -- go to the sweeps "
        "(python -m shmcoll_bench.sweep --help; the MPI sweep ignores the torch-only ones).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2, help="local ranks (default 2)")
    parser.add_argument("--quick", action="store_true", help="4 sizes up to 1 MiB, short rounds")
    parser.add_argument("--no-mpi", action="store_true", help="skip the Open MPI comparison")
    parser.add_argument("--json", metavar="PATH", help="results (default shmcoll-bench-<N>ranks.json)")
    parser.add_argument("--png", metavar="PATH", help="plot (default: the JSON path with .png)")
    parser.add_argument("sweep_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return compare(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
