#!/usr/bin/env python3
"""Where an 8-byte all_reduce's time goes: torch's own layers against shm's work.

    .venv/bin/torchrun --nproc_per_node=2 bench/bench_floor.py --json results/floor-2ranks.json

The goal is an 8 B all_reduce within 3x of Open MPI (docs/benchmark-log.md, "Goals of issue 4"; about 1.1 us here, see the
MPI sweep). This measures how much of shm's time torch itself takes, per call (best of
--rounds rounds of --iters calls; every rank runs the same loops, rank 0 reports):

  shm     dist.all_reduce(x)                   what a user pays (the default group)
  shm     dist.all_reduce(x, group=g)          as the other backends are called (naming the group
                                               saves torch's _get_default_group, about 0.2 us)
  shm     group.allreduce([x], opts)           the same without torch's Python wrapper
  noop    dist.all_reduce(x, group=g)          a Python backend that does nothing: the floor of
                                               any backend registered the way shm is
  noop    group.allreduce([x], opts)           the same without torch's Python wrapper
  shm     group.allreduce([x], new options)    options made per call, as dist.all_reduce makes them:
  noop    group.allreduce([x], new options)    what reading a fresh options object costs beyond one
                                               made once (its pybind getters)
  fake    dist.all_reduce(x, group=g)          torch's C++ FakeProcessGroup (no communication,
                                               returns at once): the floor of any backend at all
  fake    group.allreduce([x], opts).wait()    its C++ dispatch alone

So "shm - noop" is what shm does beyond being called (reading the options and the tensor,
the exchange, the kernel), and the noop and fake rows are what torch.distributed costs with
nothing behind it.
Takes about 10 s.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import torch
import torch.distributed as dist

import noop_backend  # bench/, beside this script
from shmcoll_bench import script


def per_call_us(fn, iters: int, rounds: int, barrier) -> float:
    """Best round's mean time per call, in microseconds (rounds start together)."""
    for _ in range(min(iters, 2000)):
        fn()
    best = float("inf")
    for _ in range(rounds):
        barrier()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - start) / iters)
    return best * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # one thread: no --threads
    p.add_argument("--iters", type=int, default=50000, help="calls per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", metavar="PATH", help="write the results here")
    args = p.parse_args()

    torch.set_num_threads(1)
    noop_backend.register()
    importlib.import_module("torch.testing._internal.distributed.fake_pg")  # registers the "fake" backend

    dist.init_process_group("shm")
    rank, world = dist.get_rank(), dist.get_world_size()
    ctrl = dist.new_group(backend="gloo")  # barriers between rounds
    groups = {"shm": dist.group.WORLD, "noop": dist.new_group(backend="noop"),
              "fake": dist.new_group(backend="fake")}
    x = torch.zeros(2)  # 8 bytes of float32
    opts = dist.AllreduceOptions()
    opts.asyncOp = False

    def barrier():
        dist.barrier(group=ctrl)

    def new_options():  # as dist.all_reduce makes them, once per call
        made = dist.AllreduceOptions()
        made.reduceOp = dist.ReduceOp.SUM
        made.asyncOp = False
        return made

    rows = []
    for name, label, fn in [
        ("shm", "dist.all_reduce(x)", lambda: dist.all_reduce(x)),
        ("shm", "dist.all_reduce(x, group=g)", lambda: dist.all_reduce(x, group=groups["shm"])),
        ("shm", "group.allreduce([x], opts)", lambda: groups["shm"].allreduce([x], opts)),
        ("noop", "dist.all_reduce(x, group=g)", lambda: dist.all_reduce(x, group=groups["noop"])),
        ("noop", "group.allreduce([x], opts)", lambda: groups["noop"].allreduce([x], opts)),
        ("shm", "group.allreduce([x], new options)", lambda: groups["shm"].allreduce([x], new_options())),
        ("noop", "group.allreduce([x], new options)", lambda: groups["noop"].allreduce([x], new_options())),
        ("fake", "dist.all_reduce(x, group=g)", lambda: dist.all_reduce(x, group=groups["fake"])),
        ("fake", "group.allreduce([x], opts).wait()", lambda: groups["fake"].allreduce([x], opts).wait()),
    ]:
        x.fill_(1)
        rows.append({"backend": name, "call": label, "us": per_call_us(fn, args.iters, args.rounds, barrier)})

    for r, us in zip(rows, script.slowest([r["us"] for r in rows], ctrl)):
        r["us"] = us
    if rank == 0:
        us = {(r["backend"], r["call"]): r["us"] for r in rows}
        print(f"8-byte float32 all_reduce, {world} ranks, {os.cpu_count()} CPUs, torch {torch.__version__}; "
              f"us per call, slowest rank, best of {args.rounds} rounds of {args.iters}\n")
        print("| backend | call | us |")
        print("|:--|:--|--:|")
        for r in rows:
            print(f"| {r['backend']} | `{r['call']}` | {r['us']:.2f} |")
        wrapped, direct = "dist.all_reduce(x, group=g)", "group.allreduce([x], opts)"
        beyond = us[("shm", wrapped)] - us[("noop", wrapped)]
        beyond_direct = us[("shm", direct)] - us[("noop", direct)]
        fresh = "group.allreduce([x], new options)"
        beyond_fresh = us[("shm", fresh)] - us[("noop", fresh)]
        print(f"\nshm's own work beyond a no-op Python backend: {beyond:.2f} us (called directly: "
              f"{beyond_direct:.2f} us with options made once, {beyond_fresh:.2f} us with options made per call); "
              f"a backend that does nothing pays {us[('noop', wrapped)]:.2f} us (Python) or "
              f"{us[('fake', wrapped)]:.2f} us (C++ fake) through dist.all_reduce")
        script.write_json(args.json, {"bench": "floor", "config": vars(args), "world_size": world,
                                      "cpus": os.cpu_count(), "torch": torch.__version__, "rows": rows})
    return script.finish(ctrl)


if __name__ == "__main__":
    sys.exit(main())
