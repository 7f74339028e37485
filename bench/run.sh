#!/usr/bin/env bash
# README main job: set up .venv (see .ci/setup), then run the shm-vs-gloo sweep
# at 2 ranks (override with NPROC=4), writing results/sweep-<N>ranks.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup
NPROC=${NPROC:-2}
mkdir -p results
exec .venv/bin/torchrun --nproc_per_node="$NPROC" bench/sweep.py --json "results/sweep-${NPROC}ranks.json" "$@"
