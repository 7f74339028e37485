"""The forms of torch.distributed's API beyond one tensor and one call: coalesced calls and the coalescing
manager, PREMUL_SUM, complex tensors, asynchronous Work and its future, subgroups, object collectives."""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.references import assert_equal, make_data, make_input, reference_reduce


def _coalesced(rank, world):
    tensors = [make_input("co", rank, torch.float32, n) for n in (3, 0, 17)]
    dist.all_reduce_coalesced(tensors)
    for n, t in zip((3, 0, 17), tensors):
        assert_equal(t, reference_reduce([make_input("co", r, torch.float32, n) for r in range(world)], "sum",
                                         torch.float32)[:n] if n else t, "coalesced")


def _gather_coalesced(rank, world):
    import warnings

    ins = [make_input("agc", rank, torch.float32, 4), make_input("agc2", rank, torch.float32, 3)]
    # torch's documented layout (and Gloo's): output_tensor_lists[rank][i] holds rank's input i.
    outs = [[torch.zeros(4), torch.zeros(3)] for _ in range(world)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated in torch, still public
        dist.all_gather_coalesced(outs, ins)
    for r in range(world):
        assert_equal(outs[r][0], make_input("agc", r, torch.float32, 4), "coalesced 0")
        assert_equal(outs[r][1], make_input("agc2", r, torch.float32, 3), "coalesced 1")


def _coalescing_manager_calls(rank, world):
    from torch.distributed.distributed_c10d import _coalescing_manager

    outs = [torch.zeros(5 * world), torch.zeros(2 * world)]
    ins = [make_input("cm", rank, torch.float32, 5), make_input("cm2", rank, torch.float32, 2)]
    with _coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    assert_equal(outs[0], torch.cat([make_input("cm", r, torch.float32, 5) for r in range(world)]), "cm ag 0")
    assert_equal(outs[1], torch.cat([make_input("cm2", r, torch.float32, 2) for r in range(world)]), "cm ag 1")
    rs_out = [torch.zeros(4), torch.zeros(1)]
    rs_in = [make_input("rs", rank, torch.float32, 4 * world), make_input("rs2", rank, torch.float32, world)]
    with _coalescing_manager(async_ops=True) as cm:
        for o, i in zip(rs_out, rs_in):
            dist.reduce_scatter_tensor(o, i.clone())
    cm.wait()
    for tag, o, n in (("rs", rs_out[0], 4), ("rs2", rs_out[1], 1)):
        full = reference_reduce([make_input(tag, r, torch.float32, n * world) for r in range(world)], "sum",
                                torch.float32)
        assert_equal(o, full[rank * n:(rank + 1) * n], f"cm rs {tag}")


def _premul_sum(rank, world):
    for factor in (2.5, torch.tensor(0.5)):
        t = make_input("pm", rank, torch.float32, 33)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
        expected = reference_reduce([make_input("pm", r, torch.float32, 33) for r in range(world)], "sum",
                                    torch.float32) * float(factor)
        torch.testing.assert_close(t, expected)


def _complex_sum_avg(rank, world):
    for op, name in ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg")):
        t = make_data("cx", rank, torch.complex64, 9)
        dist.all_reduce(t, op=op)
        parts = [torch.view_as_real(make_data("cx", r, torch.complex64, 9)) for r in range(world)]
        expected = torch.view_as_complex(reference_reduce(parts, name, torch.float32).contiguous())
        assert_equal(t, expected, f"complex {name}")


def _async_work(rank, world):
    t = make_input("aw", rank, torch.float32, 100_000)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    chained = fut.then(lambda f: f.value()[0].sum().item())
    assert work.wait() is True
    assert work.is_completed() and work.is_success() and work.exception() is None
    expected = reference_reduce([make_input("aw", r, torch.float32, 100_000) for r in range(world)], "sum",
                                torch.float32)
    assert_equal(t, expected, "async all_reduce")
    assert abs(chained.wait() - expected.sum().item()) < 1e-3 * max(1.0, abs(expected.sum().item()))
    # several in flight complete in issue order
    tensors = [torch.full((1000,), float(i + rank)) for i in range(5)]
    works = [dist.all_reduce(x, async_op=True) for x in tensors]
    for w in works:
        w.wait()
    for i, x in enumerate(tensors):
        assert_equal(x, torch.full((1000,), float(i * world + sum(range(world)))), f"async #{i}")


def _subgroups(rank, world):
    if world < 2:
        return
    reversed_ranks = list(range(world - 1, -1, -1))
    sub = dist.new_group(reversed_ranks)
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=sub)
    assert_equal(t, torch.tensor([float(sum(range(world)))]), "reversed group")
    pair = dist.new_group([0, world - 1])
    if rank in (0, world - 1):
        t = torch.tensor([float(rank + 1)])
        dist.broadcast(t, src=world - 1, group=pair)
        assert_equal(t, torch.tensor([float(world)]), "pair broadcast")
    groups, _ = dist.new_subgroups(group_size=2 if world % 2 == 0 else 1)
    t = torch.tensor([1.0])
    dist.all_reduce(t, group=groups)
    assert t.item() == dist.get_world_size(groups)
    for _ in range(3):  # alternate groups
        a, b = torch.tensor([1.0]), torch.tensor([1.0])
        dist.all_reduce(a, group=sub)
        dist.all_reduce(b)
        assert a.item() == world and b.item() == world


def _objects(rank, world):
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "payload": list(range(rank))})
    assert gathered == [{"rank": r, "payload": list(range(r))} for r in range(world)]
    objs = [f"from-{world - 1}", 7] if rank == world - 1 else [None, None]
    dist.broadcast_object_list(objs, src=world - 1)
    assert objs == [f"from-{world - 1}", 7]
    out = [None] * world if rank == 0 else None
    dist.gather_object(("g", rank), out, dst=0)
    if rank == 0:
        assert out == [("g", r) for r in range(world)]
    recv = [None]
    dist.scatter_object_list(recv, [f"s{r}" for r in range(world)] if rank == 0 else None, src=0)
    assert recv == [f"s{rank}"]


# case name -> check(rank, world), in the order api_surface runs them (its count of cases)
API_CASES = {
    "all_reduce_coalesced": _coalesced,
    "all_gather_coalesced": _gather_coalesced,
    "coalescing_manager": _coalescing_manager_calls,
    "premul_sum": _premul_sum,
    "complex": _complex_sum_avg,
    "async_work": _async_work,
    "subgroups": _subgroups,
    "objects": _objects,
}


def api_surface(cases):
    cases.run_each(API_CASES, dist.get_rank(), dist.get_world_size())
