"""Hierarchical shm against flat Gloo on a simulated multi-node job (SHMCOLL_HOSTID per rank).

    python bench/bench_multinode.py [--nodes 2] [--per-node 2] [--sizes 4K,64K,1M,16M] [--iters 20]

One job runs both, interleaved per size: all_reduce (float32, SUM) on the
default ``shm`` group (node arena + Gloo rails) and on a Gloo group over the
same ranks. Reports the median time per call and the bytes each rank hands to
Gloo per call: for shm what the hierarchy passes to its rails
(the ``sent`` bytes of its Links), for flat Gloo the whole message. On one machine
"TCP" is loopback, so the time ratio understates a real network; the bytes
column is what carries over.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from shmcoll._env import parse_bytes

REPO = Path(__file__).resolve().parent.parent



def _sent(placement) -> int:
    """Bytes the rank's plans handed to its rail and the leaders' link for other nodes (network.Link.sent)."""
    links = placement.links
    return sum(link.sent for link in (links.rail, links.leaders) if link is not None)


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("shm", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    where = dist.group.WORLD.placement  # the shm group is its own placement's holder (ProcessGroupShm)
    hierarchy = where if type(where).__name__ == "Nodes" else None
    gloo = dist.new_group(backend="gloo")
    rows = []
    for nbytes in [parse_bytes(s) for s in args.sizes.split(",")]:
        t = torch.ones(nbytes // 4)
        row = {"bytes": nbytes}
        for name, group in (("shm", None), ("gloo", gloo)):
            for _ in range(3):
                dist.all_reduce(t, group=group)
            before = _sent(hierarchy) if (name == "shm" and hierarchy) else 0
            times = []
            for _ in range(args.iters):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(t, group=group)
                times.append(time.perf_counter() - start)
            sent = ((_sent(hierarchy) - before) / args.iters if (name == "shm" and hierarchy)
                    else t.numel() * t.element_size())
            # The slowest rank's median: a collective is done when every rank is.
            med = torch.tensor([statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(med, op=dist.ReduceOp.MAX, group=gloo)
            row[f"{name}_us"] = med.item() * 1e6
            row[f"{name}_tcp_bytes_per_rank"] = sent
        rows.append(row)
    if rank == 0:
        print(json.dumps({"world": world, "nodes": hierarchy.nodes if hierarchy else None, "rows": rows}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--per-node", type=int, default=2)
    parser.add_argument("--sizes", default="4K,64K,1M,16M")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        return rank_main(args)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = args.nodes * args.per_node
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", SHMCOLL_HOSTID=f"bench-node{rank // args.per_node}",
                   PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank", "--sizes", args.sizes, "--iters",
                                       str(args.iters)], env=env, stdout=subprocess.PIPE if rank == 0 else None))
    out = procs[0].communicate()[0].decode()
    for proc in procs[1:]:
        proc.wait()
    result = json.loads(out.strip().splitlines()[-1])
    print(f"all_reduce float32 SUM, {args.nodes} simulated nodes x {args.per_node} ranks, "
          f"{os.cpu_count()} cores; nodes {result['nodes']}")
    print(f"{'bytes':>10} {'shm us':>10} {'gloo us':>10} {'gloo/shm':>9} {'shm TCP B/rank':>15} {'gloo TCP B/rank':>16}")
    for row in result["rows"]:
        print(f"{row['bytes']:>10} {row['shm_us']:>10.1f} {row['gloo_us']:>10.1f} "
              f"{row['gloo_us'] / row['shm_us']:>9.2f} {row['shm_tcp_bytes_per_rank']:>15.0f} "
              f"{row['gloo_tcp_bytes_per_rank']:>16.0f}")


if __name__ == "__main__":
    main()
