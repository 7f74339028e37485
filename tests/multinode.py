"""Scenarios for groups spanning several (simulated) nodes: SHMCOLL_HOSTID differs between ranks.

Every case is checked against a local reference built from (case, rank) seeds,
as in tests/scenarios.py.
"""
from __future__ import annotations


import torch
import torch.distributed as dist

from tests.scenarios import (R, _data, _equal, check_all_gather_into_tensor, check_barrier, check_broadcast,
                             make_input, reference_reduce)

# Environment of the multi-node jobs: a 4 KiB chunk reaches the multi-chunk paths with
# small inputs; the matrix's 5003 elements exceed it.
SMALL_CHUNKS = {"SHMCOLL_CHUNK_BYTES": "4096", "SHMCOLL_SMALL_BYTES": "1024"}


def _backend(group=None):
    """This rank's shm backend of ``group`` (default: the default group)."""
    from shmcoll.backend import of_group

    return of_group(group)


def _layout(pg) -> dict:
    where = pg.placement
    across = type(where).__name__ == "Nodes"  # several nodes: arenas inside, Gloo rails and a flat group
    return {"hierarchical": across, "flat_gloo": across,
            "nodes": where.nodes if across else None, "tcp_bytes": where.tcp_bytes if across else 0}


def matrix(cases, big: str = "5003"):
    """all_reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor, barrier, and flat fallbacks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = _backend()
    counts = sorted({0, 1, 7, world * 5 + 1, int(big)})
    reduce_ops = {"sum": R.SUM, "avg": R.AVG, "max": R.MAX}
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for op_name, op in reduce_ops.items():
            if op_name == "avg" and not dtype.is_floating_point:
                continue
            for count in counts:
                case = f"all_reduce/{str(dtype)[6:]}/{op_name}/n={count}"

                def all_reduce():
                    inputs = [make_input(case, r, dtype, count, op_name) for r in range(world)]
                    tensor = inputs[rank].clone()
                    dist.all_reduce(tensor, op=op)
                    _equal(tensor, reference_reduce(inputs, op_name, dtype), "all_reduce")

                cases.run(case, all_reduce)

                case = f"reduce_scatter_tensor/{str(dtype)[6:]}/{op_name}/n={count}"

                def reduce_scatter():
                    inputs = [make_input(case, r, dtype, count * world, op_name) for r in range(world)]
                    out = torch.full((count,), 3, dtype=dtype)
                    dist.reduce_scatter_tensor(out, inputs[rank], op=op)
                    expected = reference_reduce(inputs, op_name, dtype)[rank * count:(rank + 1) * count]
                    _equal(out, expected, "reduce_scatter_tensor")

                cases.run(case, reduce_scatter)

    def all_reduce_async_and_strided():
        base = torch.stack([make_input("nc", rank, torch.float32, 999), torch.full((999,), -7.0)], dim=1)
        column = base[:, 0]
        second = make_input("second", rank, torch.float32, 33)
        w1 = dist.all_reduce(column, async_op=True)
        w2 = dist.all_reduce(second, async_op=True)
        w1.wait()
        w2.wait()
        _equal(base[:, 0], reference_reduce([make_input("nc", r, torch.float32, 999) for r in range(world)], "sum",
                                            torch.float32), "strided all_reduce")
        _equal(base[:, 1], torch.full((999,), -7.0), "untouched neighbours")
        _equal(second, reference_reduce([make_input("second", r, torch.float32, 33) for r in range(world)], "sum",
                                        torch.float32), "second async all_reduce")

    cases.run("all_reduce/async_strided", all_reduce_async_and_strided)

    def premul_sum():
        t = make_input("premul", rank, torch.float32, 41)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        expected = reference_reduce([make_input("premul", r, torch.float32, 41) for r in range(world)], "sum",
                                    torch.float32) * 0.5
        _equal(t, expected, "premul_sum")

    cases.run("all_reduce/premul_sum", premul_sum)

    for dtype in (torch.float32, torch.bool, torch.complex64):
        for count in counts:
            for root in range(world):
                case = f"broadcast/{str(dtype)[6:]}/n={count}/root={root}"
                cases.run(case, check_broadcast, case, rank, root, dtype, count)

            case = f"all_gather_into_tensor/{str(dtype)[6:]}/n={count}"
            cases.run(case, check_all_gather_into_tensor, case, rank, world, dtype, count)

    cases.run("barrier", check_barrier, rank, world)

    # Operations with no hierarchical plan: the flat Gloo group.
    def all_to_all_single():
        n = 3
        inp = torch.arange(world * n, dtype=torch.float32) + 100 * rank
        out = torch.empty(world * n)
        dist.all_to_all_single(out, inp)
        expected = torch.cat([torch.arange(rank * n, (rank + 1) * n, dtype=torch.float32) + 100 * r
                              for r in range(world)])
        _equal(out, expected, "all_to_all_single")

    cases.run("all_to_all_single", all_to_all_single)

    def gather():
        root = world - 1
        tensor = _data("gather", rank, torch.float32, 13)
        outs = [torch.zeros(13) for _ in range(world)] if rank == root else None
        dist.gather(tensor, outs, dst=root)
        if rank == root:
            for r in range(world):
                _equal(outs[r], _data("gather", r, torch.float32, 13), f"gather slot {r}")

    cases.run("gather", gather)

    def all_gather_list():
        outs = [torch.zeros(9, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(outs, _data("agl", rank, torch.int64, 9))
        for r in range(world):
            _equal(outs[r], _data("agl", r, torch.int64, 9), f"all_gather slot {r}")

    cases.run("all_gather", all_gather_list)

    def mixed_order():
        # Hierarchical and flat collectives interleaved, async: issue order must hold.
        t = make_input("mixed", rank, torch.float32, 5000)
        w = dist.all_reduce(t, async_op=True)
        g = torch.zeros(world * 5000)
        dist.all_gather_into_tensor(g, t)
        w.wait()
        expected = reference_reduce([make_input("mixed", r, torch.float32, 5000) for r in range(world)], "sum",
                                    torch.float32)
        _equal(t, expected, "all_reduce")
        _equal(g, expected.repeat(world), "all_gather_into_tensor after it")

    cases.run("mixed_order", mixed_order)
    return _layout(pg)


def layout_only(cases):
    """Report how the group was built (one node: no Gloo group at all)."""
    pg = _backend()
    t = torch.ones(3)
    dist.all_reduce(t)
    cases.check("all_reduce", torch.equal(t, torch.full((3,), float(dist.get_world_size()))))
    return _layout(pg)


# Subgroups of a 2 x 2 job (nodes [0, 1] and [2, 3]): one rank per node, inside one node,
# and uneven (two ranks of one node, one of the other).
SUBGROUPS = ([1, 2], [0, 1], [2, 3], [0, 1, 3])


def subgroups(cases, big: str = "5003"):
    """all_reduce, all_gather_into_tensor and broadcast on each of SUBGROUPS, against local references."""
    rank = dist.get_rank()
    layouts = {}
    for members in SUBGROUPS:
        group = dist.new_group(members)  # every rank takes part in creating every group
        if rank not in members:
            continue
        name = "+".join(map(str, members))
        layouts[name] = _layout(_backend(group))
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            for count in (0, 1, 7, int(big)):
                for op_name, op in (("sum", R.SUM), ("max", R.MAX)):
                    case = f"group {name}/all_reduce/{str(dtype)[6:]}/{op_name}/n={count}"

                    def all_reduce():
                        tensor = make_input(case, rank, dtype, count, op_name)
                        dist.all_reduce(tensor, op=op, group=group)
                        expected = reference_reduce([make_input(case, r, dtype, count, op_name) for r in members],
                                                    op_name, dtype)
                        _equal(tensor, expected, "all_reduce")

                    cases.run(case, all_reduce)

                case = f"group {name}/all_gather_into_tensor/{str(dtype)[6:]}/n={count}"

                def all_gather():
                    out = torch.zeros(len(members) * count, dtype=dtype)
                    dist.all_gather_into_tensor(out, _data(case, rank, dtype, count), group=group)
                    _equal(out, torch.cat([_data(case, r, dtype, count) for r in members]), "all_gather_into_tensor")

                cases.run(case, all_gather)

                for root in members:  # global rank, as dist.broadcast takes it
                    case = f"group {name}/broadcast/{str(dtype)[6:]}/n={count}/root={root}"

                    def broadcast():
                        expected = _data(case, root, dtype, count)
                        t = expected.clone() if rank == root else torch.zeros(count, dtype=dtype)
                        dist.broadcast(t, src=root, group=group)
                        _equal(t, expected, "broadcast")

                    cases.run(case, broadcast)
    return {"layouts": layouts}
