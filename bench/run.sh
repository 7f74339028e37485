#!/usr/bin/env bash
# README main job: set up .venv (see .ci/setup), then run the shm-vs-gloo sweep
# at 2 ranks (override with NPROC=4), writing results/sweep-<N>ranks.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup
NPROC=${NPROC:-2}
mkdir -p results
# The settings of BENCHMARKS.md: sizes 8 B..64 MiB in x8 steps, 3 interleaved rounds of 0.1 s (~2 min).
exec .venv/bin/torchrun --nproc_per_node="$NPROC" bench/sweep.py --step 8 --rounds 3 --iters-time 0.1 \
    --ops all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast \
    --json "results/sweep-${NPROC}ranks.json" "$@"
