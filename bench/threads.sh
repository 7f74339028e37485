#!/usr/bin/env bash
# The few-ranks-many-threads benchmarks of issue 14, in one command, on a machine with many cores
# (BENCHMARKS.md, "Threads per rank"):
#
#   bash bench/threads.sh            # uses .venv if there is one, else the python on PATH
#
# For each layout RANKS x THREADS (default 2x8 4x4 8x2 16x1; LAYOUTS="2x1 4x1" on 2 cores): the
# interleaved shm-vs-gloo sweep of all_reduce, all_gather_into_tensor, reduce_scatter_tensor and
# broadcast from 64 KiB to 64 MiB with that many torch threads per rank, each with the copy ceiling
# (every rank copying 64 MiB with copy_ on its threads at once) measured in the same job; then the
# DDP step at 2x8 and 4x4. Results: results/threads-RxT.json and results/ddp-RxT.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
LAYOUTS=${LAYOUTS:-"2x8 4x4 8x2 16x1"}
DDP_LAYOUTS=${DDP_LAYOUTS:-"2x8 4x4"}
mkdir -p results
for layout in $LAYOUTS; do
    ranks=${layout%x*} threads=${layout#*x}
    echo "== sweep ${ranks} ranks x ${threads} threads" >&2
    OMP_NUM_THREADS=$threads "$PY" -m torch.distributed.run --nproc_per_node="$ranks" bench/sweep.py \
        --threads "$threads" --min-bytes 64K --max-bytes 64M --step 4 --rounds 3 --iters-time 0.1 \
        --ops all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast --dtypes float32,bfloat16 \
        --json "results/threads-${layout}.json"
done
for layout in $DDP_LAYOUTS; do
    ranks=${layout%x*} threads=${layout#*x}
    echo "== DDP ${ranks} ranks x ${threads} threads" >&2
    OMP_NUM_THREADS=$threads "$PY" -m torch.distributed.run --nproc_per_node="$ranks" bench/bench_ddp.py \
        --threads "$threads" --bucket-view --json "results/ddp-${layout}.json"
done
