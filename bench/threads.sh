#!/usr/bin/env bash
# Few ranks with many threads each (BENCHMARKS.md, "Threads per rank"): everything the many-core tables need, in
# one command, on a machine with many cores:
#
#   bash bench/threads.sh                  # uses .venv if there is one, else the python on PATH
#   BASE=../other-checkout bash bench/threads.sh   # also that build of shmcoll (built in place), same run
#
# On the lent many-core machine (offline, its own torch): `bash bench/device_carry.sh [BASE_COMMIT]` here, then
# `bash .carry/run.sh` there in one call that carries .carry (PARTS, LAYOUTS, ... pass through).
#
# Parts, in order of importance, results under results/threads/. The default PARTS, "small peers ddp", is what
# the open issue (44) asks of many cores, in one device call; "sweep base ddp peers" was issue 41's acceptance
# (its time: BENCHMARKS.md, "The third device session"), and the other parts answer the questions after it:
# PARTS="single pinned split oneshot nodes" (PARTS=all: every part, in this order):
#   small    per layout of SMALL_LAYOUTS (default "2x1 4x1": every rank on a core of its own), the 8-byte
#            all_reduce's floor against torch's own layers (bench/bench_floor.py) and the sync, async and
#            functional forms of all_reduce, all_gather_into_tensor and reduce_scatter_tensor at 8 B and
#            256 KiB (bench/bench_async.py); with BASE, BASE's build the same way after each
#   sweep    per layout RANKS x THREADS in LAYOUTS (default "2x8 4x4"; "2x1 4x1" on 2 cores): the interleaved
#            shm-vs-Gloo sweep of all_reduce, all_gather_into_tensor, reduce_scatter_tensor and broadcast,
#            64 KiB-64 MiB, float32 and bfloat16, that many torch threads per rank, and the copy ceiling
#            (every rank copying 64 MiB with copy_ on its threads at once) in the same job
#   base     BASE's build at the first layout, 64 KiB-BASE_MAX_BYTES (default 1M), shm only (the before of a
#            before/after)
#   ddp      the DDP step at each layout of DDP_LAYOUTS (default: LAYOUTS): shm, Gloo, no communication
#   peers    DeepSpeed's CPU shared-memory all-reduce beside shm and Gloo (bench/peer_deepspeed.py) at each layout
#            of PEER_LAYOUTS (default: the first), 8 B-64 MiB; skipped with a note where DeepSpeed is not installed
#   split    SHMCOLL_THREAD_BYTES 8K, 16K and 64K at the first layout, 64 KiB-1 MiB, shm only: where lanes pay
#   oneshot  the all-reduce at 8x2 and 16x1 ranks (ONESHOT_LAYOUTS), 1-256 KiB: the default one-shot limit
#            (allreduce.one_shot_limit, which falls with the ranks and caps SHMCOLL_SMALL_BYTES too) against
#            two steps from 512 B on (SHMCOLL_SMALL_BYTES=512), shm only
#   single   single copy (peers' buffers read with process_vm_readv, its reads and reductions over the lanes)
#            against the copy path over the lanes, interleaved in one job (bench/bench_single_copy.py) at each
#            layout of LAYOUTS, 256 KiB-64 MiB; the probe's read cost beside it decides whether groups use it
#   pinned   the sweep at each layout of LAYOUTS with every rank bound to its own consecutive share of the CPUs
#            (the sweep's --pin, as numactl or taskset would), 64 KiB-64 MiB, shm only: whether binding pays
#   nodes    two simulated nodes (two torchruns, each its own SHMCOLL_HOSTID) of NODE_LAYOUT RANKS x THREADS each
#            (default 2x4), 1 MiB-64 MiB, shm only: the node stages of the plans across nodes on the rank's threads
#            (SHMCOLL_THREADS unset) against one thread (SHMCOLL_THREADS=1), alternated twice
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
LAYOUTS=${LAYOUTS:-"2x8 4x4"}
DDP_LAYOUTS=${DDP_LAYOUTS:-$LAYOUTS}
PEER_LAYOUTS=${PEER_LAYOUTS:-${LAYOUTS%% *}}
ONESHOT_LAYOUTS=${ONESHOT_LAYOUTS:-"8x2 16x1"}
NODE_LAYOUT=${NODE_LAYOUT:-2x4}
SMALL_LAYOUTS=${SMALL_LAYOUTS:-"2x1 4x1"}
PARTS=${PARTS:-"small peers ddp"}
[ "$PARTS" = all ] && PARTS="small sweep base ddp peers split oneshot single pinned nodes"
OUT=${RESULTS:-results/threads}
mkdir -p "$OUT"
first=${LAYOUTS%% *}
"$PY" -m shmcoll info > "$OUT/info.txt" 2>&1 || true  # the machine as shmcoll sees it (single copy's read cost)

wants() { [[ " $PARTS " == *" $1 "* ]]; }

# torchrun with RANKS x THREADS (torchrun alone would set OMP_NUM_THREADS=1), then the script (or -m and a
# module) and its arguments.
run() {
    local layout=$1; shift
    local ranks=${layout%x*} threads=${layout#*x}
    OMP_NUM_THREADS=$threads "$PY" -m torch.distributed.run --nproc_per_node="$ranks" "$@" --threads "$threads"
}

sweep() {  # layout, json name, extra sweep arguments
    local layout=$1 name=$2; shift 2
    echo "== $name: sweep at $layout $*" >&2
    run "$layout" -m shmcoll_bench.sweep --rounds 3 --iters-time 0.1 --json "$OUT/$name.json" "$@"
}

if wants small; then
    for layout in $SMALL_LAYOUTS; do
        for build in this ${BASE:+base}; do
            path=$( [ "$build" = base ] && echo "$(cd "$BASE" && pwd)/src${PYTHONPATH:+:$PYTHONPATH}" \
                    || echo "${PYTHONPATH:-}" )
            ranks=${layout%x*} threads=${layout#*x}
            echo "== small messages at $layout, $build build" >&2
            for script in floor async; do
                PYTHONPATH=$path OMP_NUM_THREADS=$threads "$PY" -m torch.distributed.run \
                    --nproc_per_node="$ranks" bench/bench_$script.py --rounds 3 \
                    --json "$OUT/$script-$layout-$build.json" | tee "$OUT/$script-$layout-$build.txt"
            done
        done
    done
fi
if wants sweep; then
    for layout in $LAYOUTS; do
        sweep "$layout" "sweep-$layout" --min-bytes 64K --max-bytes 64M --step 4 \
            --ops all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast --dtypes float32,bfloat16
    done
fi
if wants base && [ -n "${BASE:-}" ]; then
    base_path="$(cd "$BASE" && pwd)/src${PYTHONPATH:+:$PYTHONPATH}"
    PYTHONPATH=$base_path "$PY" -c "import shmcoll; print('base: shmcoll from', shmcoll.__file__)" >&2
    PYTHONPATH=$base_path sweep "$first" "base-$first" --backends shm --min-bytes 64K \
        --max-bytes "${BASE_MAX_BYTES:-1M}" --step 4 --memcpy-time 0.1
fi
if wants ddp; then
    for layout in $DDP_LAYOUTS; do
        echo "== DDP at $layout" >&2
        run "$layout" bench/bench_ddp.py --bucket-view --json "$OUT/ddp-$layout.json"
    done
fi
if wants peers; then
    for layout in $PEER_LAYOUTS; do
        echo "== DeepSpeed's all-reduce beside shm and Gloo at $layout" >&2
        run "$layout" bench/peer_deepspeed.py --min-bytes 8 --max-bytes 64M --rounds 3 \
            --json "$OUT/peers-$layout.json" || echo "peers at $layout failed (see above)" >&2
    done
fi
if wants split; then
    for bytes in 8K 16K 64K; do
        SHMCOLL_THREAD_BYTES=$bytes sweep "$first" "split-$bytes" --backends shm --min-bytes 64K --max-bytes 1M \
            --step 4 --memcpy-time 0.1
    done
fi
if wants oneshot; then
    for layout in $ONESHOT_LAYOUTS; do
        for small in default 512; do
            SHMCOLL_SMALL_BYTES=${small/default/} sweep "$layout" "oneshot-$layout-$small" --backends shm \
                --ops all_reduce --dtypes float32 --min-bytes 1K --max-bytes 256K --step 2 --memcpy-time 0.1
        done
    done
fi
if wants single; then
    for layout in $LAYOUTS; do
        echo "== single copy against the copy path at $layout" >&2
        run "$layout" bench/bench_single_copy.py --sizes 256K,4M,64M --rounds 3 | tee "$OUT/single-$layout.txt"
    done
fi
if wants pinned; then
    for layout in $LAYOUTS; do
        echo "== pinned: sweep at $layout, every rank bound to its own share of the CPUs" >&2
        sweep "$layout" "pinned-$layout" --pin --backends shm --min-bytes 64K --max-bytes 64M --step 4 \
            --memcpy-time 0.1 --ops all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast \
            --dtypes float32,bfloat16
    done
fi
if wants nodes; then
    ranks=${NODE_LAYOUT%x*} threads=${NODE_LAYOUT#*x}
    for round in 1 2; do
        for lanes in default 1; do
            echo "== two nodes of $NODE_LAYOUT, SHMCOLL_THREADS=$lanes, round $round" >&2
            port=$((29600 + round * 2 + ${lanes/default/0}))
            for node in 0 1; do  # the second in the background; both end with the job
                SHMCOLL_HOSTID=threads-node$node SHMCOLL_THREADS=${lanes/default/} OMP_NUM_THREADS=$threads \
                    "$PY" -m torch.distributed.run --nnodes 2 --node-rank $node --nproc-per-node "$ranks" \
                    --master-addr 127.0.0.1 --master-port $port -m shmcoll_bench.sweep --threads "$threads" \
                    --backends shm --min-bytes 1M --max-bytes 64M --step 4 --rounds 3 --iters-time 0.1 \
                    --ops all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast --dtypes float32 \
                    --json "$OUT/nodes-$NODE_LAYOUT-lanes-$lanes-$round.json" &
            done
            wait
        done
    done
fi
echo "results in $OUT" >&2
