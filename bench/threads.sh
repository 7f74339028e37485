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
# Parts, in order of importance, results under results/threads/. The default PARTS, "peers ceiling ddp", is what
# issue 58 (many cores, second step) asks in one device call, with BASE (main before the change) beside this
# build in the peers part; the second call, PARTS="prefill oneshot anomaly", measures the layers users run, what
# decides the defaults and where the 2 and 8 MiB time goes. "sweep base ddp peers" was issue 41's acceptance (its time: BENCHMARKS.md, "The
# third device session"); the other parts answer the questions after it: PARTS="single pinned split nodes"
# (PARTS=all: every part, in this order):
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
#            of PEER_LAYOUTS (default: LAYOUTS), 8 B-64 MiB, float32 and bfloat16, twice (the acceptance's second
#            job, without Gloo); with BASE, BASE's build the same way after each (without Gloo); skipped with a
#            note where DeepSpeed is not installed
#   prefill  per layout of LAYOUTS: tensor-parallel prefill layers (bench/bench_prefill.py: a matrix product on the
#            rank's threads, then the all-reduce of 128 KiB-8 MiB of bfloat16), shm against DeepSpeed, where the
#            computation before each all-reduce leaves shm's lane threads asleep and DeepSpeed's OpenMP team warm
#   ceiling  per layout of LAYOUTS: all_gather_into_tensor and reduce_scatter_tensor of 16 and 64 MiB, float32 and
#            bfloat16, shm only, with the copy ceiling (every rank copying 64 MiB with copy_ at once) in the same
#            job: what fraction of it the copy path reaches
#   split    SHMCOLL_THREAD_BYTES 8K, 16K and 64K at the first layout, 64 KiB-1 MiB, shm only: where lanes pay
#   oneshot  the all-reduce at each layout of ONESHOT_LAYOUTS (default: LAYOUTS), 8 KiB-8 MiB, float32 and
#            bfloat16, shm only, one job per setting: the default one-shot limit (allreduce.one_shot_limit) against
#            one step over the lanes up to its cap (SHMCOLL_SMALL_BYTES=2M: T x 1 MiB / L^2 within the lanes'
#            slots), each with the default lane minimum and with SHMCOLL_THREAD_BYTES=16K (lanes from 32 KiB):
#            where one step with every lane beats two steps per chunk, which DeepSpeed's one step (peers) sets
#            the bar for
#   anomaly  at the first layout, the all-reduce of 1-8 MiB (float32, shm only) in a job of its own, with the
#            default slots and with SHMCOLL_CHUNK_BYTES=768K (each lane's stretch of 2 and 8 MiB no longer a
#            whole number of its slots), then DeepSpeed's job over the same sizes: whether the 2 and 8 MiB points
#            that were out of line beside DeepSpeed (BENCHMARKS.md, "Threads per rank") are so alone, and with
#            which slots
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
PEER_LAYOUTS=${PEER_LAYOUTS:-$LAYOUTS}
ONESHOT_LAYOUTS=${ONESHOT_LAYOUTS:-$LAYOUTS}
NODE_LAYOUT=${NODE_LAYOUT:-2x4}
SMALL_LAYOUTS=${SMALL_LAYOUTS:-"2x1 4x1"}
PARTS=${PARTS:-"peers ceiling ddp"}
[ "$PARTS" = all ] && PARTS="peers ceiling ddp prefill oneshot anomaly small sweep base split single pinned nodes"
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

base_path() { echo "$(cd "$BASE" && pwd)/src${PYTHONPATH:+:$PYTHONPATH}"; }

peers() {  # layout, json name, extra peer_deepspeed arguments
    local layout=$1 name=$2; shift 2
    run "$layout" bench/peer_deepspeed.py --rounds 3 --json "$OUT/$name.json" "$@" \
        || echo "peers $name at $layout failed (see above)" >&2
}

if wants peers; then
    for job in 1 2; do
        for layout in $PEER_LAYOUTS; do
            echo "== DeepSpeed's all-reduce beside shm and Gloo at $layout, job $job" >&2
            peers "$layout" "peers-$layout-$job" --min-bytes 8 --max-bytes 64M $( [ $job = 1 ] || echo --no-gloo )
            if [ -n "${BASE:-}" ]; then
                echo "== the same with BASE's shm at $layout, job $job" >&2
                PYTHONPATH=$(base_path) peers "$layout" "peers-$layout-base-$job" --min-bytes 8 --max-bytes 64M \
                    --no-gloo
            fi
        done
    done
fi
if wants ceiling; then
    for layout in $LAYOUTS; do
        sweep "$layout" "ceiling-$layout" --backends shm --min-bytes 16M --max-bytes 64M --step 4 \
            --ops all_gather_into_tensor,reduce_scatter_tensor --dtypes float32,bfloat16 --memcpy-time 0.5
    done
fi
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
    PYTHONPATH=$(base_path) "$PY" -c "import shmcoll; print('base: shmcoll from', shmcoll.__file__)" >&2
    PYTHONPATH=$(base_path) sweep "$first" "base-$first" --backends shm --min-bytes 64K \
        --max-bytes "${BASE_MAX_BYTES:-1M}" --step 4 --memcpy-time 0.1
fi
if wants ddp; then
    for layout in $DDP_LAYOUTS; do
        echo "== DDP at $layout" >&2
        run "$layout" bench/bench_ddp.py --bucket-view --json "$OUT/ddp-$layout.json"
    done
fi
if wants split; then
    for bytes in 8K 16K 64K; do
        SHMCOLL_THREAD_BYTES=$bytes sweep "$first" "split-$bytes" --backends shm --min-bytes 64K --max-bytes 1M \
            --step 4 --memcpy-time 0.1
    done
fi
if wants prefill; then
    for layout in $LAYOUTS; do
        echo "== prefill layers at $layout" >&2
        run "$layout" bench/bench_prefill.py --no-gloo --json "$OUT/prefill-$layout.json" | tee "$OUT/prefill-$layout.txt"
    done
fi
if wants oneshot; then
    for layout in $ONESHOT_LAYOUTS; do
        for small in default 2M; do
            for lane in default 16K; do
                SHMCOLL_SMALL_BYTES=${small/default/} SHMCOLL_THREAD_BYTES=${lane/default/} \
                    sweep "$layout" "oneshot-$layout-small-$small-lane-$lane" --backends shm --ops all_reduce \
                    --dtypes float32,bfloat16 --min-bytes 8K --max-bytes 8M --step 4 --memcpy-time 0.1
            done
        done
    done
fi
if wants anomaly; then
    for chunk in default 768K; do
        SHMCOLL_CHUNK_BYTES=${chunk/default/} sweep "$first" "anomaly-$first-chunk-$chunk" --backends shm \
            --ops all_reduce --dtypes float32 --min-bytes 1M --max-bytes 8M --step 2 --memcpy-time 0.1
    done
    echo "== anomaly: DeepSpeed's job over the same sizes at $first" >&2
    peers "$first" "anomaly-$first-peers" --min-bytes 1M --max-bytes 8M --step 2 --dtypes float32 --no-gloo
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
