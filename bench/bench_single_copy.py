"""Single copy against the copy path inside a node, interleaved in one job.

    torchrun --nproc_per_node=2 bench/bench_single_copy.py [--sizes 32K,256K,2M,16M] [--rounds 5] [--threads 1]

Two shm groups over the same ranks, one made with SHMCOLL_SINGLE_COPY=1 (every
size reads the peers' buffers) and one with 0 (every size copies through the
arena), and their calls alternate round by round, so that a machine whose
speed drifts (a shared VM can run twice as slow for minutes) weighs on both
alike; separate jobs per path cannot show which is faster there. Prints, per
collective and size (nccl-tests sizes: all_gather's output, reduce_scatter's
input; reduce's input per rank, gather's and scatter's block per rank, all_to_all_single's input per rank), the median over rounds of rank 0's time per call for each path and
their ratio, and the read cost the probe measured (``single_copy.read_cost``),
which decides the default (``placement.node.single_copy_spans``). With ``--threads T`` each rank has T
torch threads, so both groups split large messages over T lanes (the copy path's lanes, single copy's
reads and reductions: docs/DESIGN.md, "Single copy").
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from shmcoll_bench.cases import ALL_OPS, OpCase, counts_for
from shmcoll_bench.report import SHORT_OP
from shmcoll_bench.sweep import parse_bytes


ROOTED = ("reduce", "gather", "scatter", "all_to_all_single")  # beside the sweep's ops (shmcoll_bench.cases.ALL_OPS)


def collective(op: str, nbytes: int, group, world: int, rank: int):
    """The call of ``op`` at ``nbytes`` on ``group``, float32: the sweep's case (nccl-tests sizes), or for
    reduce ``nbytes`` per rank, for gather and scatter ``nbytes`` per rank's block, for all_to_all_single
    ``nbytes`` of input per rank."""
    if op not in ROOTED:
        case = OpCase(op, counts_for(op, nbytes, 4, world), torch.float32, world, rank)
        return case.fn(group, *case.alloc())
    count = max(1, nbytes // 4)
    if op == "reduce":
        tensor = torch.ones(count)
        return lambda: dist.reduce(tensor, dst=0, group=group)
    if op == "gather":
        block, blocks = torch.ones(count), [torch.empty(count) for _ in range(world)] if rank == 0 else None
        return lambda: dist.gather(block, blocks, dst=0, group=group)
    if op == "scatter":
        block, blocks = torch.empty(count), [torch.ones(count) for _ in range(world)] if rank == 0 else None
        return lambda: dist.scatter(block, blocks, src=0, group=group)
    count = max(world, count - count % world)
    source, target = torch.ones(count), torch.empty(count)
    return lambda: dist.all_to_all_single(target, source, group=group)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="32K,256K,2M,16M")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", default="all_reduce,reduce_scatter_tensor,all_gather_into_tensor,broadcast",
                        help=f"comma list of {', '.join(ALL_OPS + ROOTED)}")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank: the groups' lanes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # before the groups: their lanes follow it
    groups = {}
    for path, mode in (("copy", "0"), ("single copy", "1")):
        os.environ["SHMCOLL_SINGLE_COPY"] = mode  # read when each group is made
        if not dist.is_initialized():
            dist.init_process_group("shm")
            groups[path] = dist.group.WORLD
        else:
            groups[path] = dist.new_group(backend="shm")
    control = dist.new_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    verdict = groups["single copy"].placement.single_copy  # what the group's probe found
    if rank == 0:
        lanes = groups["single copy"].placement.lanes.count
        print(f"{world} ranks, {lanes} lane(s) each; single copy refused here: {verdict.refused}" if verdict.refused
              else f"{world} ranks, {lanes} lane(s) each; the group's probe: a read of a peer costs "
                   f"{verdict.read_cost:.2f} copies here")
        print(f"{'op':17s} {'bytes':>8s} {'single copy us':>15s} {'copy us':>9s} {'copy/single':>12s}")
    for op in args.ops.split(","):
        for nbytes in (parse_bytes(s) for s in args.sizes.split(",")):
            iters = max(5, min(500, int(2e5 / max(1, nbytes >> 10))))
            calls = {path: collective(op, nbytes, group, world, rank) for path, group in groups.items()}
            times = {path: [] for path in groups}
            for _ in range(args.rounds):
                for path, call in calls.items():
                    for _ in range(5):
                        call()
                    dist.barrier(group=control)
                    start = time.perf_counter()
                    for _ in range(iters):
                        call()
                    times[path].append((time.perf_counter() - start) / iters * 1e6)
            if rank == 0:
                single, copy = statistics.median(times["single copy"]), statistics.median(times["copy"])
                print(f"{SHORT_OP.get(op, op):17s} {nbytes >> 10:>5d} KiB {single:>15.1f} {copy:>9.1f} {copy / single:>12.2f}",
                      flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
