#!/usr/bin/env python3
"""What each way of calling a collective costs: synchronous, ``async_op=True`` + ``wait()``, and functional.

    .venv/bin/torchrun --nproc_per_node=2 bench/bench_async.py [--sizes 8,256K] [--ops all_reduce,...] [--json PATH]

Tensor parallelism (DTensor, ``parallelize_module``) and compiled code issue their collectives as
functional collectives (``torch.distributed._functional_collectives``, whose ops reach the group as
asynchronous calls and are waited for by ``wait_tensor``); DDP, FSDP2 and pipelining call with
``async_op=True``. For all_reduce, all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single (even
blocks, what expert parallelism's token exchange and DTensor's redistribution run), gather and scatter (rank 0
the root; no functional form) (--ops), float32, at each
size, on shm (the default group), on a Gloo group over the same ranks, on a Python backend that moves
nothing ("noop": the floor of each call form for a backend registered as shm is) and on torch's C++
FakeProcessGroup ("fake": the floor for any backend, C++ included), interleaved:

  sync        dist.<op>(...)
  async       dist.<op>(..., async_op=True).wait()
  funcol      funcol.<op>(..., group) then wait_tensor (what DTensor and TP layers run)
  funcol_     torch.ops._c10d_functional.<op>_ (in place, all_reduce only) then wait_tensor
  list        the list form, one tensor per rank: dist.all_gather(outputs, input) (what torchmetrics,
              Lightning and all_gather_object call), dist.all_to_all(outputs, inputs) (not on Gloo, which
              has no list form of all_to_all)

us per call: the slowest rank's best of --rounds rounds (a round: --iters-time seconds of calls after
a barrier), and each form's time over the synchronous one's. Results are checked once per form.
"""
from __future__ import annotations

import importlib
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import noop_backend  # bench/, beside this script
from shmcoll_bench import script, timing
from shmcoll_bench.cases import ALL_GATHER, FUNCOL_ALL_GATHER, FUNCOL_REDUCE_SCATTER, REDUCE_SCATTER
from shmcoll_bench.sweep import Ctrl, parse_bytes

OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")  # the default --ops
EVERY_OP = (*OPS, "all_to_all_single", "gather", "scatter")
FORMS = ("sync", "async", "funcol", "funcol_", "list")


def calls(op: str, nbytes: int, group, world: int, rank: int):
    """form -> call returning its output, a reset of the input, and the expected output, for ``op`` of ``nbytes``
    (all_gather: its output, or the list of its outputs; the others: the tensor or the input) on ``group``."""
    n = max(1, nbytes // 4)

    def returning(out, call):
        def run():
            call()
            return out
        return run

    if op == "all_reduce":
        x = torch.full((n,), float(rank + 1))

        def functional_in_place():
            return torch.ops._c10d_functional.wait_tensor(
                torch.ops._c10d_functional.all_reduce_(x, "sum", group.group_name))

        forms = {
            "sync": returning(x, lambda: dist.all_reduce(x, group=group)),
            "async": returning(x, lambda: dist.all_reduce(x, group=group, async_op=True).wait()),
            "funcol": lambda: funcol.all_reduce(x, "sum", group).wait(),
            "funcol_": functional_in_place,
        }
        return forms, lambda: x.fill_(float(rank + 1)), torch.full((n,), float(world * (world + 1) // 2))
    per = max(1, n // world)
    if op == "all_gather_into_tensor":
        inp, out = torch.full((per,), float(rank)), torch.empty(per * world)
        outs = [torch.empty(per) for _ in range(world)]
        forms = {
            "sync": returning(out, lambda: ALL_GATHER(out, inp, group=group)),
            "async": returning(out, lambda: ALL_GATHER(out, inp, group=group, async_op=True).wait()),
            "funcol": lambda: FUNCOL_ALL_GATHER(inp, 0, group).wait(),
            "list": returning(outs, lambda: dist.all_gather(outs, inp, group=group)),
        }
        return forms, lambda: None, torch.arange(world, dtype=torch.float32).repeat_interleave(per)
    if op == "all_to_all_single":  # rank r's block j holds r * world + j
        inp = (rank * world + torch.arange(world, dtype=torch.float32)).repeat_interleave(per)
        out = torch.empty(per * world)
        ins, outs = list(inp.chunk(world)), [torch.empty(per) for _ in range(world)]
        forms = {
            "sync": returning(out, lambda: dist.all_to_all_single(out, inp, group=group)),
            "async": returning(out, lambda: dist.all_to_all_single(out, inp, group=group, async_op=True).wait()),
            "funcol": lambda: funcol.all_to_all_single(inp, None, None, group).wait(),
        }
        if dist.get_backend(group) != "gloo":
            forms["list"] = returning(outs, lambda: dist.all_to_all(outs, ins, group=group))
        return forms, lambda: None, (torch.arange(world, dtype=torch.float32) * world + rank).repeat_interleave(per)
    if op == "gather":  # to rank 0; rank r's block holds r (another rank's "output" is its input)
        inp = torch.full((per,), float(rank))
        outs = [torch.empty(per) for _ in range(world)] if rank == 0 else None
        forms = {
            "sync": returning(outs or inp, lambda: dist.gather(inp, outs, dst=0, group=group)),
            "async": returning(outs or inp, lambda: dist.gather(inp, outs, dst=0, group=group, async_op=True).wait()),
        }
        want = torch.arange(world, dtype=torch.float32).repeat_interleave(per) if rank == 0 else inp
        return forms, lambda: None, want
    if op == "scatter":  # from rank 0; block j holds j
        ins = [torch.full((per,), float(j)) for j in range(world)] if rank == 0 else None
        out = torch.empty(per)
        forms = {
            "sync": returning(out, lambda: dist.scatter(out, ins, src=0, group=group)),
            "async": returning(out, lambda: dist.scatter(out, ins, src=0, group=group, async_op=True).wait()),
        }
        return forms, lambda: None, torch.full((per,), float(rank))
    inp, out = torch.ones(per * world), torch.empty(per)
    forms = {
        "sync": returning(out, lambda: REDUCE_SCATTER(out, inp, group=group)),
        "async": returning(out, lambda: REDUCE_SCATTER(out, inp, group=group, async_op=True).wait()),
        "funcol": lambda: FUNCOL_REDUCE_SCATTER(inp, "sum", 0, group).wait(),
    }
    return forms, lambda: None, torch.full((per,), float(world))


def main() -> int:
    p = script.parser(__doc__)
    script.add_best_round_options(p, sizes="8,256K")
    p.add_argument("--ops", default=",".join(OPS),
                   help=f"comma list of {', '.join(EVERY_OP)} (default: {','.join(OPS)})")
    args = p.parse_args()
    job = script.start(args.threads)
    rank, world = job.rank, job.world
    noop_backend.register()
    importlib.import_module("torch.testing._internal.distributed.fake_pg")  # registers the "fake" backend
    groups = {"shm": dist.group.WORLD, "gloo": job.groups["gloo"], "noop": dist.new_group(backend="noop"),
              "fake": dist.new_group(backend="fake")}
    ctrl = Ctrl(job.ctrl)
    rows = []
    for op in args.ops.split(","):
        for nbytes in map(parse_bytes, args.sizes.split(",")):
            row = {"op": op, "bytes": nbytes, "us": {}}
            for backend, group in groups.items():
                forms, reset, want = calls(op, nbytes, group, world, rank)
                for form, fn in forms.items():
                    reset()
                    got = fn()
                    if not torch.equal(torch.cat(got) if isinstance(got, list) else got, want) \
                            and backend not in ("noop", "fake"):
                        raise SystemExit(f"rank {rank}: {op} {form} on {backend} gave a wrong result")
                    seconds = timing.best_round(fn, ctrl, args.iters_time, args.rounds, warmup=20)
                    row["us"][f"{backend}/{form}"] = seconds * 1e6
            row["us"] = dict(zip(row["us"], ctrl.max(list(row["us"].values()))))  # the slowest rank's
            rows.append(row)
    if rank == 0:
        print(f"{world} ranks, {len(os.sched_getaffinity(0))} usable CPUs, torch {torch.__version__}; float32, us per "
              f"call (slowest rank, best of {args.rounds} rounds), and over the synchronous call\n")
        print("| op | bytes | backend | " + " | ".join(FORMS) + " |")
        print("|---|---:|---|" + "---:|" * len(FORMS))
        for row in rows:
            for backend in groups:
                sync = row["us"][f"{backend}/sync"]
                cells = [f"{row['us'][k]:.1f} ({row['us'][k] / sync:.2f}x)" if (k := f"{backend}/{form}") in row["us"]
                         else "" for form in FORMS]
                print(f"| {row['op']} | {row['bytes']} | {backend} | " + " | ".join(cells) + " |")
        script.write_json(args.json, {"bench": "async", "config": vars(args), "world_size": world,
                                      "torch": torch.__version__, "rows": rows})
    return script.finish(job.ctrl)


if __name__ == "__main__":
    sys.exit(main())
