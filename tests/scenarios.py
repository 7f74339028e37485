"""Scenarios run inside spawned ranks (see tests/worker.py); each records cases.

Inputs are generated from (case, rank) seeds, so every rank can rebuild every
other rank's input and compute the expected result locally. Values are chosen
so that sums and products are exact in every dtype and any order; results are
then also compared with Gloo's where Gloo supports the combination.
"""
from __future__ import annotations

import functools
import os
import time
import weakref
import zlib

import torch
import torch.distributed as dist

from tests import leaks

R = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
ALL_DTYPES = FLOATS + INTS + [torch.bool]
ARITH_OPS = {"sum": R.SUM, "product": R.PRODUCT, "min": R.MIN, "max": R.MAX}
BIT_OPS = {"band": R.BAND, "bor": R.BOR, "bxor": R.BXOR}


def ops_for(dtype):
    ops = dict(ARITH_OPS)
    if not dtype.is_floating_point:
        ops.update(BIT_OPS)
    else:
        ops["avg"] = R.AVG
    return ops


def make_input(case: str, rank: int, dtype, count: int, op_name: str = "sum") -> torch.Tensor:
    """Deterministic input of ``rank`` for ``case``; exact under the op in every order."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{case}/{rank}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=g).bool()
    if dtype.is_floating_point:
        if op_name == "product":  # powers of two: products stay exact
            choices = torch.tensor([0.5, 1.0, 2.0, -1.0, -0.5])
            return choices[torch.randint(0, 5, (count,), generator=g)].to(dtype)
        return (torch.randint(-32, 33, (count,), generator=g).to(torch.float64) / 4).to(dtype)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -1000), min(info.max, 1000)
    return torch.randint(low, high + 1, (count,), generator=g, dtype=torch.int64).to(dtype)


def reference_reduce(inputs, op_name: str, dtype):
    """The result every rank must get: rank-order reduction, half types in float32 rounded once."""
    acc_type = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    xs = [x.to(acc_type) for x in inputs]
    fn = {"sum": torch.add, "avg": torch.add, "product": torch.mul, "min": torch.minimum, "max": torch.maximum,
          "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op_name]
    if dtype == torch.bool:
        fn = {"sum": torch.logical_or, "max": torch.logical_or, "bor": torch.logical_or,
              "product": torch.logical_and, "min": torch.logical_and, "band": torch.logical_and,
              "bxor": torch.logical_xor}[op_name]
    out = functools.reduce(fn, xs)
    if op_name == "avg":  # the correctly rounded mean, as Gloo computes it
        out = out / len(inputs)
    return out.to(dtype)


def _equal(actual, expected, what):
    if not torch.equal(actual, expected):
        diff = (actual != expected).nonzero()
        first = int(diff[0]) if len(diff) else -1
        raise AssertionError(f"{what}: {len(diff)} of {actual.numel()} elements differ; first at {first}: "
                             f"got {actual.reshape(-1)[first].item()}, expected {expected.reshape(-1)[first].item()}")


# What Gloo itself refuses (checked on every rank before any communication).
_GLOO_REFUSALS = ("Invalid scalar type", "Cannot use ReduceOp", "not supported")


def _gloo_all_reduce(tensor, op, group):
    """Gloo's result, or None where Gloo does not support the dtype/op."""
    try:
        dist.all_reduce(tensor, op=op, group=group)
    except RuntimeError as error:
        if any(text in str(error) for text in _GLOO_REFUSALS):
            return None
        raise
    return tensor


def _counts(world: int, big: int):
    return sorted({0, 1, 7, world * 5 + 1, 1000, big})


def allreduce_matrix_planned(world: int, big: str = "5003") -> int:
    """How many cases ``allreduce_matrix`` runs: every (dtype, op) at every count, the strided and the 3-d one."""
    return sum(len(ops_for(dtype)) for dtype in ALL_DTYPES) * len(_counts(world, int(big))) + 2


def allreduce_matrix(cases, big: str = "5003"):
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    for dtype in ALL_DTYPES:
        for op_name, op in ops_for(dtype).items():
            for count in _counts(world, int(big)):
                case = f"all_reduce/{str(dtype)[6:]}/{op_name}/n={count}"

                def run():
                    inputs = [make_input(case, r, dtype, count, op_name) for r in range(world)]
                    expected = reference_reduce(inputs, op_name, dtype)
                    tensor = inputs[rank].clone()
                    dist.all_reduce(tensor, op=op)
                    _equal(tensor, expected, "shm vs local reference")
                    theirs = _gloo_all_reduce(inputs[rank].clone(), op, gloo)
                    if theirs is not None:
                        _equal(tensor, theirs, "shm vs gloo")

                cases.run(case, run)

    def non_contiguous():
        base = torch.stack([make_input("nc", rank, torch.float32, 999), torch.full((999,), -7.0)], dim=1)
        column = base[:, 0]
        assert not column.is_contiguous()
        dist.all_reduce(column)
        expected = reference_reduce([make_input("nc", r, torch.float32, 999) for r in range(world)], "sum",
                                    torch.float32)
        _equal(base[:, 0], expected, "strided all_reduce")
        _equal(base[:, 1], torch.full((999,), -7.0), "untouched neighbours")

    cases.run("all_reduce/non_contiguous", non_contiguous)

    def shapes():
        t = make_input("shape", rank, torch.float32, 60).reshape(3, 4, 5)
        dist.all_reduce(t)
        expected = reference_reduce([make_input("shape", r, torch.float32, 60) for r in range(world)], "sum",
                                    torch.float32)
        _equal(t.reshape(-1), expected, "3-d all_reduce")

    cases.run("all_reduce/3d", shapes)


MOVED_DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64, torch.uint8]


def data_movement_planned(world: int, big: str = "300001") -> int:
    """How many cases ``data_movement`` runs: per dtype and count a broadcast per root, all_gather and
    all_gather_into_tensor; then the two strided ones and the barrier."""
    return len(MOVED_DTYPES) * len(_counts(world, int(big))) * (world + 2) + 3


def data_movement(cases, big: str = "300001"):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in MOVED_DTYPES:
        for count in _counts(world, int(big)):
            for root in range(world):
                case = f"broadcast/{str(dtype)[6:]}/n={count}/root={root}"
                cases.run(case, check_broadcast, case, rank, root, dtype, count)

            case = f"all_gather/{str(dtype)[6:]}/n={count}"

            def gather_list():
                outs = [torch.zeros(count, dtype=dtype) for _ in range(world)]
                dist.all_gather(outs, _data(case, rank, dtype, count))
                for r in range(world):
                    _equal(outs[r], _data(case, r, dtype, count), f"all_gather slot {r}")

            cases.run(case, gather_list)

            case = f"all_gather_into_tensor/{str(dtype)[6:]}/n={count}"
            cases.run(case, check_all_gather_into_tensor, case, rank, world, dtype, count)

    def gather_strided_outputs():
        grid = torch.zeros(101, world)
        outs = [grid[:, r] for r in range(world)]
        dist.all_gather(outs, _data("strided", rank, torch.float32, 101))
        for r in range(world):
            _equal(grid[:, r], _data("strided", r, torch.float32, 101), f"strided output {r}")

    cases.run("all_gather/strided_outputs", gather_strided_outputs)

    def broadcast_strided():
        grid = torch.zeros(77, 3)
        if rank == world - 1:
            grid[:, 1] = _data("bstrided", 0, torch.float32, 77)
        dist.broadcast(grid[:, 1], src=world - 1)
        _equal(grid[:, 1], _data("bstrided", 0, torch.float32, 77), "strided broadcast")
        _equal(grid[:, 0], torch.zeros(77), "untouched neighbours")

    cases.run("broadcast/strided", broadcast_strided)

    cases.run("barrier", check_barrier, rank, world)


def around_spans(cases):
    """Every collective with a measured single-copy span (placement.node.SINGLE_COPY_SPANS), at each edge of it
    and one element either side, float32 and bfloat16, against local references: in the default mode the
    path changes at those sizes (tests/test_single_copy.py makes the probe find cheap reads)."""
    from shmcoll.placement.node import SINGLE_COPY_SPANS

    rank, world = dist.get_rank(), dist.get_world_size()
    for kind, span in SINGLE_COPY_SPANS.items():
        for edge in [e for e in span if e is not None]:
            for dtype in (torch.float32, torch.bfloat16):
                itemsize = torch.tensor([], dtype=dtype).element_size()
                for count in (edge // itemsize - 1, edge // itemsize, edge // itemsize + 1):
                    case = f"{kind}/{str(dtype)[6:]}/n={count}"
                    cases.run(case, _at_a_span_edge, kind, case, rank, world, dtype, count)


def _at_a_span_edge(kind, case, rank, world, dtype, count):
    """One call of ``kind`` whose per-rank size (what the span is of) is ``count`` elements."""
    if kind == "all_gather":
        return check_all_gather_into_tensor(case, rank, world, dtype, count)
    if kind == "broadcast":
        return check_broadcast(case, rank, world - 1, dtype, count)
    if kind == "all_reduce":
        inputs = [make_input(case, r, dtype, count) for r in range(world)]
        tensor = inputs[rank].clone()
        dist.all_reduce(tensor)
        return _equal(tensor, reference_reduce(inputs, "sum", dtype), "all_reduce")
    inputs = [make_input(case, r, dtype, count * world) for r in range(world)]  # reduce_scatter
    out = torch.zeros(count, dtype=dtype)
    dist.reduce_scatter_tensor(out, inputs[rank].clone())
    _equal(out, reference_reduce(inputs, "sum", dtype)[rank * count:(rank + 1) * count], "reduce_scatter_tensor")


def check_barrier(rank, world):
    """Three barriers; after each, every rank's arrival file (written just before it) must exist."""
    folder = os.path.dirname(os.environ["SHMCOLL_TEST_REPORT"])
    for round_ in range(3):
        open(os.path.join(folder, f"arrived-{round_}-{rank}"), "w").close()
        dist.barrier()
        missing = [r for r in range(world) if not os.path.exists(os.path.join(folder, f"arrived-{round_}-{r}"))]
        assert not missing, f"barrier round {round_} returned before ranks {missing} arrived"


def check_broadcast(case, rank, root, dtype, count):
    """Broadcast ``root``'s input for ``case`` and compare with it on every rank."""
    expected = _data(case, root, dtype, count)
    t = expected.clone() if rank == root else torch.zeros(count, dtype=dtype)
    dist.broadcast(t, src=root)
    _equal(t, expected, "broadcast")


def check_all_gather_into_tensor(case, rank, world, dtype, count):
    """Gather every rank's input for ``case`` into one tensor and compare with their concatenation."""
    out = torch.zeros(world * count, dtype=dtype)
    dist.all_gather_into_tensor(out, _data(case, rank, dtype, count))
    _equal(out, torch.cat([_data(case, r, dtype, count) for r in range(world)]), "all_gather_into_tensor")


def _data(case, rank, dtype, count):
    if dtype.is_complex:
        return torch.view_as_complex(make_input(case, rank, torch.float32, 2 * count).reshape(count, 2))
    return make_input(case, rank, dtype, count)


def _reduce_dtypes_ops():
    """A spread of (dtype, op name) pairs for the rooted and scattered reductions."""
    return [(torch.float32, "sum"), (torch.float32, "max"), (torch.bfloat16, "sum"), (torch.float16, "avg"),
            (torch.int64, "sum"), (torch.int32, "bxor"), (torch.uint8, "min"), (torch.bool, "bor"),
            (torch.float64, "product")]


GATHERED_DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64]
_SPLIT_SEEDS = (1, 3, 1001)


def rooted_and_scattered_planned(world: int, big: str = "5003") -> int:
    """How many cases ``rooted_and_scattered`` runs: per reduction pair and count a reduce per root (0 and
    world - 1) and both reduce_scatters; per gathered dtype and count a gather and a scatter per root and both
    all_to_alls; an all_to_all per split seed."""
    counts, roots = len(_counts(world, int(big))), len({0, world - 1})
    return (len(_reduce_dtypes_ops()) * counts * (roots + 2) + len(GATHERED_DTYPES) * counts * (2 * roots + 2)
            + len(_SPLIT_SEEDS))


def rooted_and_scattered(cases, big: str = "5003"):
    """reduce, gather, scatter, reduce_scatter (list and tensor), all_to_all (list, single, splits)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    counts = _counts(world, int(big))
    for dtype, op_name in _reduce_dtypes_ops():
        op = ops_for(dtype)[op_name]
        for count in counts:
            for root in sorted({0, world - 1}):
                case = f"reduce/{str(dtype)[6:]}/{op_name}/n={count}/root={root}"

                def run_reduce():
                    inputs = [make_input(case, r, dtype, count, op_name) for r in range(world)]
                    tensor = inputs[rank].clone()
                    dist.reduce(tensor, dst=root, op=op)
                    if rank == root:
                        _equal(tensor, reference_reduce(inputs, op_name, dtype), "reduce at root")
                    else:
                        _equal(tensor, inputs[rank], "reduce leaves non-root tensors alone")

                cases.run(case, run_reduce)

            case = f"reduce_scatter_tensor/{str(dtype)[6:]}/{op_name}/n={count}"

            def run_rs_tensor():
                inputs = [make_input(case, r, dtype, count * world, op_name) for r in range(world)]
                out = torch.zeros(count, dtype=dtype)
                dist.reduce_scatter_tensor(out, inputs[rank].clone(), op=op)
                expected = reference_reduce(inputs, op_name, dtype)[rank * count:(rank + 1) * count]
                _equal(out, expected, "reduce_scatter_tensor")

            cases.run(case, run_rs_tensor)

            case = f"reduce_scatter/{str(dtype)[6:]}/{op_name}/n={count}"

            def run_rs_list():
                inputs = [make_input(case, r, dtype, count * world, op_name) for r in range(world)]
                out = torch.zeros(count, dtype=dtype)
                dist.reduce_scatter(out, list(inputs[rank].clone().chunk(world)) if count else
                                    [torch.zeros(0, dtype=dtype)] * world, op=op)
                expected = reference_reduce(inputs, op_name, dtype)[rank * count:(rank + 1) * count]
                _equal(out, expected, "reduce_scatter")

            cases.run(case, run_rs_list)

    for dtype in GATHERED_DTYPES:
        for count in counts:
            for root in sorted({0, world - 1}):
                case = f"gather/{str(dtype)[6:]}/n={count}/root={root}"

                def run_gather():
                    outs = [torch.zeros(count, dtype=dtype) for _ in range(world)] if rank == root else None
                    dist.gather(_data(case, rank, dtype, count), outs, dst=root)
                    if rank == root:
                        for r in range(world):
                            _equal(outs[r], _data(case, r, dtype, count), f"gather slot {r}")

                cases.run(case, run_gather)
                case = f"scatter/{str(dtype)[6:]}/n={count}/root={root}"

                def run_scatter():
                    out = torch.zeros(count, dtype=dtype)
                    ins = [_data(case, r, dtype, count) for r in range(world)] if rank == root else None
                    dist.scatter(out, ins, src=root)
                    _equal(out, _data(case, rank, dtype, count), "scatter")

                cases.run(case, run_scatter)

            case = f"all_to_all_single/{str(dtype)[6:]}/n={count}"

            def run_a2a_single():
                rows = count * world
                ins = [_data(case, r, dtype, rows) for r in range(world)]
                out = torch.zeros(rows, dtype=dtype)
                dist.all_to_all_single(out, ins[rank])
                expected = torch.cat([ins[r][rank * count:(rank + 1) * count] for r in range(world)])
                _equal(out, expected, "all_to_all_single")

            cases.run(case, run_a2a_single)

            case = f"all_to_all/{str(dtype)[6:]}/n={count}"

            def run_a2a_list():
                ins = [[_data(f"{case}/{r}->{j}", r, dtype, count) for j in range(world)] for r in range(world)]
                outs = [torch.zeros(count, dtype=dtype) for _ in range(world)]
                dist.all_to_all(outs, ins[rank])
                for r in range(world):
                    _equal(outs[r], ins[r][rank], f"all_to_all from {r}")

            cases.run(case, run_a2a_list)

    def splits(seed_count):
        """Uneven split sizes: rank r sends (r + j + seed) % 4 * seed rows to rank j (some zero)."""
        return [[(r + j + seed_count) % 4 * seed_count for j in range(world)] for r in range(world)]

    for seed_count in _SPLIT_SEEDS:
        case = f"all_to_all_single/splits/rows={seed_count}"

        def run_a2a_splits():
            table = splits(seed_count)
            send = table[rank]
            recv = [table[r][rank] for r in range(world)]
            data = _data(case, rank, torch.float32, sum(send) * 3).reshape(-1, 3)
            out = torch.zeros(sum(recv), 3)
            dist.all_to_all_single(out, data, output_split_sizes=recv, input_split_sizes=send)
            pieces = []
            for r in range(world):
                theirs = _data(case, r, torch.float32, sum(table[r]) * 3).reshape(-1, 3)
                start = sum(table[r][:rank])
                pieces.append(theirs[start:start + table[r][rank]])
            _equal(out, torch.cat(pieces), "all_to_all_single with splits")
            theirs = torch.zeros(sum(recv), 3)
            dist.all_to_all_single(theirs, data, output_split_sizes=recv, input_split_sizes=send, group=gloo)
            _equal(out, theirs, "shm vs gloo")

        cases.run(case, run_a2a_splits)


def api_surface(cases):
    """Coalesced forms, PREMUL_SUM, complex, async Work, subgroups, object collectives."""
    rank, world = dist.get_rank(), dist.get_world_size()

    def coalesced():
        tensors = [make_input("co", rank, torch.float32, n) for n in (3, 0, 17)]
        dist.all_reduce_coalesced(tensors)
        for n, t in zip((3, 0, 17), tensors):
            _equal(t, reference_reduce([make_input("co", r, torch.float32, n) for r in range(world)], "sum",
                                       torch.float32)[:n] if n else t, "coalesced")

    cases.run("all_reduce_coalesced", coalesced)

    def gather_coalesced():
        import warnings

        ins = [make_input("agc", rank, torch.float32, 4), make_input("agc2", rank, torch.float32, 3)]
        # torch's documented layout (and Gloo's): output_tensor_lists[rank][i] holds rank's input i.
        outs = [[torch.zeros(4), torch.zeros(3)] for _ in range(world)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated in torch, still public
            dist.all_gather_coalesced(outs, ins)
        for r in range(world):
            _equal(outs[r][0], make_input("agc", r, torch.float32, 4), "coalesced 0")
            _equal(outs[r][1], make_input("agc2", r, torch.float32, 3), "coalesced 1")

    cases.run("all_gather_coalesced", gather_coalesced)

    def coalescing_manager():
        from torch.distributed.distributed_c10d import _coalescing_manager

        outs = [torch.zeros(5 * world), torch.zeros(2 * world)]
        ins = [make_input("cm", rank, torch.float32, 5), make_input("cm2", rank, torch.float32, 2)]
        with _coalescing_manager(async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)
        cm.wait()
        _equal(outs[0], torch.cat([make_input("cm", r, torch.float32, 5) for r in range(world)]), "cm ag 0")
        _equal(outs[1], torch.cat([make_input("cm2", r, torch.float32, 2) for r in range(world)]), "cm ag 1")
        rs_out = [torch.zeros(4), torch.zeros(1)]
        rs_in = [make_input("rs", rank, torch.float32, 4 * world), make_input("rs2", rank, torch.float32, world)]
        with _coalescing_manager(async_ops=True) as cm:
            for o, i in zip(rs_out, rs_in):
                dist.reduce_scatter_tensor(o, i.clone())
        cm.wait()
        for tag, o, n in (("rs", rs_out[0], 4), ("rs2", rs_out[1], 1)):
            full = reference_reduce([make_input(tag, r, torch.float32, n * world) for r in range(world)], "sum",
                                    torch.float32)
            _equal(o, full[rank * n:(rank + 1) * n], f"cm rs {tag}")

    cases.run("coalescing_manager", coalescing_manager)

    def premul_sum():
        for factor in (2.5, torch.tensor(0.5)):
            t = make_input("pm", rank, torch.float32, 33)
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
            expected = reference_reduce([make_input("pm", r, torch.float32, 33) for r in range(world)], "sum",
                                        torch.float32) * float(factor)
            torch.testing.assert_close(t, expected)

    cases.run("premul_sum", premul_sum)

    def complex_sum_avg():
        for op, name in ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg")):
            t = _data("cx", rank, torch.complex64, 9)
            dist.all_reduce(t, op=op)
            parts = [torch.view_as_real(_data("cx", r, torch.complex64, 9)) for r in range(world)]
            expected = torch.view_as_complex(reference_reduce(parts, name, torch.float32).contiguous())
            _equal(t, expected, f"complex {name}")

    cases.run("complex", complex_sum_avg)

    def async_work():
        t = make_input("aw", rank, torch.float32, 100_000)
        work = dist.all_reduce(t, async_op=True)
        fut = work.get_future()
        chained = fut.then(lambda f: f.value()[0].sum().item())
        assert work.wait() is True
        assert work.is_completed() and work.is_success() and work.exception() is None
        expected = reference_reduce([make_input("aw", r, torch.float32, 100_000) for r in range(world)], "sum",
                                    torch.float32)
        _equal(t, expected, "async all_reduce")
        assert abs(chained.wait() - expected.sum().item()) < 1e-3 * max(1.0, abs(expected.sum().item()))
        # several in flight complete in issue order
        tensors = [torch.full((1000,), float(i + rank)) for i in range(5)]
        works = [dist.all_reduce(x, async_op=True) for x in tensors]
        for w in works:
            w.wait()
        for i, x in enumerate(tensors):
            _equal(x, torch.full((1000,), float(i * world + sum(range(world)))), f"async #{i}")

    cases.run("async_work", async_work)

    def subgroups():
        if world < 2:
            return
        reversed_ranks = list(range(world - 1, -1, -1))
        sub = dist.new_group(reversed_ranks)
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=sub)
        _equal(t, torch.tensor([float(sum(range(world)))]), "reversed group")
        pair = dist.new_group([0, world - 1])
        if rank in (0, world - 1):
            t = torch.tensor([float(rank + 1)])
            dist.broadcast(t, src=world - 1, group=pair)
            _equal(t, torch.tensor([float(world)]), "pair broadcast")
        groups, _ = dist.new_subgroups(group_size=2 if world % 2 == 0 else 1)
        t = torch.tensor([1.0])
        dist.all_reduce(t, group=groups)
        assert t.item() == dist.get_world_size(groups)
        for _ in range(3):  # alternate groups
            a, b = torch.tensor([1.0]), torch.tensor([1.0])
            dist.all_reduce(a, group=sub)
            dist.all_reduce(b)
            assert a.item() == world and b.item() == world

    cases.run("subgroups", subgroups)

    def objects():
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

    cases.run("objects", objects)


def point_to_point(cases):
    """send/recv, isend/irecv in both orders, batch_isend_irecv, any source, tags, many in flight."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        def self_send_refused():
            try:
                dist.send(torch.zeros(1), 0)
            except (ValueError, RuntimeError) as error:
                assert "itself" in str(error) or "same as the rank" in str(error), error
            else:
                raise AssertionError("send to self did not raise")

        cases.run("p2p/self_send_refused", self_send_refused)
        return
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    # 3000001 float32 = 12 MB: far more than one channel (64 KiB by default, 4 KiB in the small config).
    for count in (0, 1, 7, 1000, 100_003, 3_000_001):
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            case = f"p2p/ring/{str(dtype)[6:]}/n={count}"

            def ring():
                out = _data(case, rank, dtype, count)
                inp = torch.zeros(count, dtype=dtype)
                for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, inp, prv)]):
                    q.wait()
                _equal(inp, _data(case, prv, dtype, count), "batch_isend_irecv ring")
                back = torch.zeros(count, dtype=dtype)
                receiving = dist.irecv(back, prv)  # receive posted before the send, on every rank
                sending = dist.isend(out, nxt)
                receiving.wait()
                sending.wait()
                _equal(back, _data(case, prv, dtype, count), "irecv before isend")

            cases.run(case, ring)

    def blocking_pairs():
        if rank % 2 == 0 and rank + 1 < world:
            dist.send(_data("bp", rank, torch.float32, 5000), rank + 1, tag=3)
            got = torch.zeros(17, dtype=torch.int64)
            dist.recv(got, rank + 1)
            _equal(got, _data("bp2", rank + 1, torch.int64, 17), "recv reply")
        elif rank % 2 == 1:
            got = torch.zeros(5000)
            dist.recv(got, rank - 1, tag=3)
            _equal(got, _data("bp", rank - 1, torch.float32, 5000), "recv")
            dist.send(_data("bp2", rank, torch.int64, 17), rank - 1)

    cases.run("p2p/blocking_pairs", blocking_pairs)

    def any_source():
        if rank == 0:
            sources = []
            for _ in range(world - 1):
                t = torch.zeros(3)
                src = dist.recv(t)  # no src: any source, returns the sender
                assert t[0].item() == src, (t, src)
                sources.append(src)
            assert sorted(sources) == list(range(1, world)), sources
        else:
            dist.send(torch.full((3,), float(rank)), 0)

    cases.run("p2p/any_source", any_source)

    def many_in_flight():
        if rank == 0:
            works = [dist.isend(torch.full((777,), float(i)), 1, tag=9) for i in range(64)]
        elif rank == 1:
            bufs = [torch.zeros(777) for _ in range(64)]
            works = [dist.irecv(b, 0, tag=9) for b in bufs]
        else:
            works = []
        for w in works:
            w.wait()
        if rank == 1:
            for i, b in enumerate(bufs):
                _equal(b, torch.full((777,), float(i)), f"message {i}")

    cases.run("p2p/many_in_flight", many_in_flight)

    def object_lists():
        if rank == 0:
            dist.send_object_list([{"from": 0}, "two", 3], dst=1)
        elif rank == 1:
            objects = [None, None, None]
            dist.recv_object_list(objects, src=0)
            assert objects == [{"from": 0}, "two", 3], objects

    cases.run("p2p/send_recv_object_list", object_lists)

    def compiled_path():
        """A message that moves whole at once goes from the group's method to the channel in one compiled call
        (_p2p.SmallTransfers) on both sides, with the same Work; one that must wait goes the Python way."""
        small = dist.distributed_c10d._get_default_group()._small_transfers
        before = small.taken
        message = _data("compiled", 0, torch.float32, 33)
        got = torch.zeros(33)
        work = None
        dist.all_reduce(torch.zeros(1))  # every earlier message received: the channel's halves are free
        if rank == 0:
            work = dist.isend(message, 1, tag=4)
        dist.all_reduce(torch.zeros(1))  # the message is in the channel before rank 1 receives it
        if rank == 1:
            work = dist.irecv(got, 0, tag=4)
        if work is not None:
            assert work.is_completed() and work.wait(), work
        if rank == 1:
            _equal(got, message, "a receive through the compiled path")
            assert work._source_rank() == 0, work._source_rank()
        assert small.taken == before + (rank < 2), (small.taken, before)
        if rank == 1:  # posted before its message: the Python way, which waits for it
            work = dist.irecv(got, 0, tag=6)
        dist.all_reduce(torch.zeros(1))
        if rank == 0:
            dist.send(message + 1, 1, tag=6)  # taken
        elif rank == 1:
            work.wait()
            _equal(got, message + 1, "a receive that waited")
        assert small.taken == before + 2 * (rank == 0) + (rank == 1), (small.taken, before)

    cases.run("p2p/compiled_path", compiled_path)

    def receive_waited_otherwise():
        """A small receive posted before its message waits in the channel for its caller's wait() without
        waking the p2p thread (p2p.TransferWork); asked anything else, it must still complete: polled with
        is_completed(), waited with a timeout, through its future."""
        from datetime import timedelta

        if rank > 1:
            return
        for way in ("polled", "timeout", "future"):
            if rank == 0:
                time.sleep(0.2)  # the receive is posted first
                dist.send(torch.full((3,), float(len(way))), 1, tag=5)
                continue
            got = torch.zeros(3)
            work = dist.irecv(got, 0, tag=5)
            deadline = time.monotonic() + 10
            if way == "polled":
                while not work.is_completed():
                    assert time.monotonic() < deadline, "is_completed() never became true"
                    time.sleep(0.001)
            elif way == "timeout":
                work.wait(timeout=timedelta(seconds=10))
            else:
                future = work.get_future()
                while not future.done():
                    assert time.monotonic() < deadline, "the receive's future never completed"
                    time.sleep(0.001)
            _equal(got, torch.full((3,), float(len(way))), f"a receive {way}")

    cases.run("p2p/receive_waited_otherwise", receive_waited_otherwise)

    # Last: it leaves the tag-1 message unreceived in the 0 -> 1 channel, on purpose.
    def wrong_tag_is_an_error():
        if rank == 0:
            dist.send(torch.zeros(4), 1, tag=1)
        elif rank == 1:
            try:
                dist.recv(torch.zeros(4), 0, tag=2)
            except RuntimeError as error:
                assert "tag 2" in str(error) and "tag 1" in str(error), error
            else:
                raise AssertionError("a receive for tag 2 accepted a message sent with tag 1")

    cases.run("p2p/wrong_tag", wrong_tag_is_an_error)

    dist.barrier()


def lifecycle(cases):
    """Device routing errors, Work timeouts, async returning early, re-initialisation, group teardown."""
    from datetime import timedelta

    rank, world = dist.get_rank(), dist.get_world_size()

    def foreign_device_is_refused():
        try:
            dist.all_reduce(torch.zeros(4, device="meta"))
        except (ValueError, RuntimeError) as error:
            assert "CPU" in str(error) and "meta" in str(error), error
        else:
            raise AssertionError("a meta tensor was accepted")

    cases.run("device/meta_refused", foreign_device_is_refused)

    def async_returns_before_completion():
        if world == 1:
            return
        big = torch.ones(16 << 20)  # 64 MiB
        dist.all_reduce(big)  # warm
        start = time.perf_counter()
        dist.all_reduce(big)
        sync_time = time.perf_counter() - start
        start = time.perf_counter()
        work = dist.all_reduce(big, async_op=True)
        issue_time = time.perf_counter() - start
        a = torch.randn(256, 256)
        for _ in range(3):
            a = a @ a / 256  # computation while the all-reduce progresses
        work.wait()
        # Returning takes a queue hand-off; the work itself takes the whole synchronous time.
        # Half leaves room for a loaded machine (measured 1/4 to 1/10 when quiet).
        assert issue_time < sync_time / 2, (issue_time, sync_time)
        assert big[0].item() == world ** 3, big[0].item()

    cases.run("async/returns_before_completion", async_returns_before_completion)

    def wait_timeout():
        if world == 1:
            return
        if rank == 0:
            t = torch.zeros(1)
            work = dist.irecv(t, 1)
            start = time.monotonic()
            try:
                work.wait(timedelta(milliseconds=300))
            except RuntimeError as error:
                assert "did not complete within 0.3 s" in str(error), error
                assert 0.25 < time.monotonic() - start < 3, time.monotonic() - start
            else:
                raise AssertionError("wait(timeout) returned before the message was sent")
            dist.barrier()
            work.wait()
            assert t.item() == 42
        else:
            dist.barrier()
            if rank == 1:
                dist.send(torch.tensor([42.0]), 0)

    cases.run("work/wait_timeout", wait_timeout)

    def new_group_timeout_is_honoured():
        if world == 1:
            return
        group = dist.new_group(timeout=timedelta(seconds=1))  # the default group's is 30 minutes
        if rank == 0:
            start = time.monotonic()
            try:
                dist.all_reduce(torch.ones(4), group=group)
            except RuntimeError as error:
                elapsed = time.monotonic() - start
                assert 0.9 < elapsed < 2.5, elapsed
                assert "Timed out after 1 s" in str(error) and "rank(s) 1" in str(error), error
            else:
                raise AssertionError("all_reduce returned although rank 1 never called it")
        dist.barrier()  # rank 1 arrives here without calling the all_reduce
        dist.destroy_process_group(group)

    cases.run("timeout/new_group", new_group_timeout_is_honoured)

    def destroy_and_reinit():
        sub = dist.new_group()
        x = torch.ones(2)
        dist.all_reduce(x, group=sub)
        dist.destroy_process_group(sub)
        maps = [line for line in leaks.references() if line.startswith("map ")]
        assert len(maps) == (1 if world > 1 else 0), maps  # only the default group's arena is mapped
        dist.destroy_process_group()
        assert not leaks.references()
        # A fresh FileStore per round: re-binding env://'s TCPStore port races with the old server.
        folder = os.path.dirname(os.environ["SHMCOLL_TEST_REPORT"])
        for round_ in range(2):
            dist.init_process_group("shm", init_method=f"file://{folder}/reinit-{round_}", rank=rank,
                                    world_size=world)
            y = torch.full((3,), float(rank))
            dist.all_reduce(y)
            _equal(y, torch.full((3,), float(sum(range(world)))), "after re-init")
            dist.destroy_process_group()
        dist.init_process_group("shm", init_method=f"file://{folder}/reinit-final", rank=rank, world_size=world)

    cases.run("lifecycle/destroy_and_reinit", destroy_and_reinit)


_OVERLAP_COUNTS = (1, 7, 5003)
_OVERLAP_BLOCKS = ("own", "another")  # an all_gather_into_tensor's input inside its output
_OVERLAP_LAYOUTS = ("every_ranks", "even_ranks", "next_block")  # a reduce_scatter_tensor's output inside its input


def in_place_overlap_planned(world: int) -> int:
    """How many cases ``in_place_overlap`` runs: per count each block, the list all_gather, each layout and the
    all_to_all."""
    return len(_OVERLAP_COUNTS) * (len(_OVERLAP_BLOCKS) + 1 + len(_OVERLAP_LAYOUTS) + 1)


def in_place_overlap(cases):
    """Input that is this rank's slice of the output (FSDP's in-place form), output inside the input, on every
    rank or on some: a correct result."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for count in _OVERLAP_COUNTS:
        for block in _OVERLAP_BLOCKS:
            case = f"overlap/all_gather_into_tensor/{block}_block/n={count}"

            def gather_from_a_block():
                # The input is a block of the output: this rank's own (FSDP's in-place form), or the next
                # rank's, whose writes must not reach the input before every peer has read it.
                at = rank if block == "own" else (rank + 1) % world
                out = torch.zeros(world * count)
                out[at * count:(at + 1) * count] = make_input(case, rank, torch.float32, count)
                dist.all_gather_into_tensor(out, out[at * count:(at + 1) * count])
                _equal(out, torch.cat([make_input(case, r, torch.float32, count) for r in range(world)]), case)

            cases.run(case, gather_from_a_block)
        case = f"overlap/all_gather/input_is_an_output/n={count}"

        def gather_list_into_its_input():
            # The input is also the output for the last rank's block (a list all_gather).
            source = make_input(case, rank, torch.float32, count)
            outs = [torch.zeros(count) for _ in range(world - 1)] + [source]
            dist.all_gather(outs, source)
            for r in range(world):
                _equal(outs[r], make_input(case, r, torch.float32, count), f"{case} slot {r}")

        cases.run(case, gather_list_into_its_input)
        # Output inside the input: its own block on every rank, then only on the even ones, then the next
        # rank's block (which that rank reads) on every rank. A path on which the peers read a rank's input
        # must not let that rank's output overwrite it first, and must be every rank's, though only some
        # overlap.
        for layout in _OVERLAP_LAYOUTS:
            case = f"overlap/reduce_scatter_tensor/{layout}/n={count}"

            def scatter_in_place():
                inputs = [make_input(case, r, torch.float32, world * count) for r in range(world)]
                buf = inputs[rank].clone()
                inside = layout != "even_ranks" or rank % 2 == 0
                at = (rank + 1) % world if layout == "next_block" else rank
                out = buf[at * count:(at + 1) * count] if inside else torch.zeros(count)
                dist.reduce_scatter_tensor(out, buf)
                _equal(out, reference_reduce(inputs, "sum", torch.float32)[rank * count:(rank + 1) * count], case)

            cases.run(case, scatter_in_place)
        case = f"overlap/all_to_all_single/even_ranks/n={count}"

        def all_to_all_in_place_on_some():
            inputs = [_data(case, r, torch.float32, world * count) for r in range(world)]
            buf = inputs[rank].clone()
            out = buf if rank % 2 == 0 else torch.zeros(world * count)
            dist.all_to_all_single(out, buf)
            _equal(out, torch.cat([inputs[r][rank * count:(rank + 1) * count] for r in range(world)]), case)

        cases.run(case, all_to_all_in_place_on_some)


def no_numba_after_init(cases):
    """With the kernel library built, a group and reductions of every dtype never import Numba."""
    import sys

    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int8, torch.bool):
        t = torch.ones(1000, dtype=dtype)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if dtype == torch.bool else dist.ReduceOp.SUM)
        expected = torch.ones(1000, dtype=dtype) * (1 if dtype == torch.bool else world)
        cases.check(f"no_numba/{dtype}", torch.equal(t, expected), f"rank {rank}: {t[:4].tolist()}")
    loaded = sorted(name for name in sys.modules if name == "numba" or name.startswith(("numba.", "llvmlite")))
    cases.check("no_numba/modules", not loaded, f"rank {rank} imported {loaded[:5]}")


def lane_threads() -> list[str]:
    """The ids of this process's lane threads (native threads, named shmcoll-lane<j>)."""
    found = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().startswith("shmcoll-lane"):
                    found.append(task)
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return found


def single_copy_over_lanes_planned(world: int, big: str = "20011") -> int:
    return (allreduce_matrix_planned(world, big) + data_movement_planned(world, big)
            + rooted_and_scattered_planned(world) + in_place_overlap_planned(world) + 1)


def single_copy_over_lanes(cases, big: str = "20011"):
    """The all-reduce matrix, every data-movement collective, the rooted ones and all_to_all with single copy
    forced on and several lanes:
    their reads and reductions split over the lane threads, which single copy must have borrowed."""
    allreduce_matrix(cases, big)
    data_movement(cases, big)
    rooted_and_scattered(cases)
    in_place_overlap(cases)
    lanes = dist.group.WORLD.placement.lanes
    cases.check("lanes/single-copy", lanes._single_copy is not None and len(lane_threads()) == lanes.count - 1,
                f"single copy did not split over the lanes ({len(lane_threads())} lane threads)")


def lane_threads_sleep(cases):
    """After a collective split over lanes, the lane threads take no CPU while nothing runs."""
    x = torch.ones(1 << 20)  # 4 MiB: several lanes at the default SHMCOLL_THREAD_BYTES
    dist.all_reduce(x)
    cases.check("lanes/result", bool((x == dist.get_world_size()).all()), "wrong all_reduce result")
    lanes = lane_threads()
    cases.check("lanes/started", len(lanes) >= 1, "no shmcoll-lane thread in /proc/self/task")

    def ticks() -> int:  # user + system time of the lane threads, in clock ticks
        total = 0
        for task in lanes:
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total

    before = ticks()
    time.sleep(1.0)
    used = ticks() - before
    cases.check("lanes/idle", used <= 2, f"idle lane threads used {used} clock ticks in 1 s")
    dist.barrier()
    dist.destroy_process_group()
    cases.check("lanes/gone", not lane_threads(), f"lane threads left after destroy_process_group: {lane_threads()}")


def fast_paths(cases):
    """A call of an (op, dtype, root) met before takes its collective's fast path (no ``_launch``) when it is
    synchronous, or asynchronous and small, with plain tensors; anything else takes the general path; both
    give the reference's result."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    launches = []
    general = pg._launch
    pg._launch = lambda *args, **kwargs: launches.append(1) or general(*args, **kwargs)

    def own_work(case, work):
        # an asynchronous call's Work is its own (torch's synchronous wrappers share one completed Work)
        assert work is not pg._engine.shared_completed, f"{case}: an async call returned the shared completed Work"
        work.wait()

    def all_reduce(case, dtype, count, op_name, async_op, make=torch.Tensor):
        inputs = [make_input(case, r, dtype, count, op_name) for r in range(world)]
        tensor = inputs[rank].clone().as_subclass(make)
        work = dist.all_reduce(tensor, op=ops_for(dtype)[op_name], async_op=async_op)
        if async_op:
            own_work(case, work)
        _equal(tensor.as_subclass(torch.Tensor), reference_reduce(inputs, op_name, dtype), case)

    def reduce_scatter(case, dtype, count, op_name, async_op, make=torch.Tensor):
        inputs = [make_input(case, r, dtype, world * count, op_name) for r in range(world)]
        out = torch.zeros(count, dtype=dtype).as_subclass(make)
        work = dist.reduce_scatter_tensor(out, inputs[rank].clone(), op=ops_for(dtype)[op_name], async_op=async_op)
        if async_op:
            own_work(case, work)
        expected = reference_reduce(inputs, op_name, dtype)[rank * count:(rank + 1) * count]
        _equal(out.as_subclass(torch.Tensor), expected, case)

    def broadcast(case, dtype, count, op_name, async_op, make=torch.Tensor):
        root = world - 1
        tensor = (make_input(case, root, dtype, count) if rank == root else torch.zeros(count, dtype=dtype))
        tensor = tensor.as_subclass(make)
        work = dist.broadcast(tensor, root, async_op=async_op)
        if async_op:
            own_work(case, work)
        _equal(tensor.as_subclass(torch.Tensor), make_input(case, root, dtype, count), case)

    def all_gather(case, dtype, count, op_name, async_op, make=torch.Tensor):
        out = torch.zeros(world * count, dtype=dtype).as_subclass(make)
        work = dist.all_gather_into_tensor(out, make_input(case, rank, dtype, count), async_op=async_op)
        if async_op:
            own_work(case, work)
        _equal(out.as_subclass(torch.Tensor), torch.cat([make_input(case, r, dtype, count) for r in range(world)]),
               case)

    class Subclass(torch.Tensor):
        pass

    # On one node, the calls of the fast paths that one C schedule call on one lane runs go whole through
    # compiled code (shmcoll._front.SmallCollectives), which keeps the group's bookkeeping
    # (describe_current) as the general path does.
    compiled = getattr(pg._small, "taken", None)
    one_lane_bytes = getattr(pg.placement, "one_lane_bytes", {})
    placement_kind = {"all_reduce": "all_reduce", "reduce_scatter_tensor": "reduce_scatter",
                      "broadcast": "broadcast", "all_gather_into_tensor": "all_gather"}

    big = 300_001  # above the one-shot limit and the inline asynchronous size: overlap pays
    for name, call, dtype, op_name in (("all_reduce", all_reduce, torch.float32, "sum"),
                                       ("all_reduce", all_reduce, torch.int32, "max"),
                                       ("reduce_scatter_tensor", reduce_scatter, torch.bfloat16, "sum"),
                                       ("broadcast", broadcast, torch.float64, None),
                                       ("all_gather_into_tensor", all_gather, torch.int16, None)):
        # (call, count, asynchronous, tensor type, whether the fast path takes it once admitted)
        for n, (count, async_op, make, fast) in enumerate(((7, False, torch.Tensor, False),  # admits
                                                           (7, False, torch.Tensor, True),
                                                           (1, True, torch.Tensor, True),
                                                           (5003, False, torch.Tensor, True),
                                                           (big, True, torch.Tensor, False),
                                                           (7, False, Subclass, False))):
            case = f"fast_path/{name}/{dtype}/{op_name}/n={count}/async={async_op}/{make.__name__}#{n}"

            if count == big:  # one rank runs everything inline (placement.single): it has nothing to overlap
                fast = pg.placement.async_inline

            def run():
                launches.clear()
                before = pg._small.taken if compiled is not None else 0
                seq = pg._state.seq
                call(case, dtype, count, op_name, async_op, make)
                went = "the general path" if launches else "the fast path"
                assert bool(launches) != fast, f"{case}: took {went}"
                took = (pg._small.taken - before) if compiled is not None else 0
                want = fast and count * dtype.itemsize <= one_lane_bytes.get(placement_kind[name], 0)
                assert took == want, f"{case}: the compiled path took {took} calls, not {int(want)}"
                assert pg._state.seq == seq + 1 and f"{count} elements) #{seq + 1}" in pg.describe_current(), \
                    f"{case}: the group's bookkeeping says {pg.describe_current()!r} after call #{seq + 1}"

            cases.run(case, run)

    # The compiled path reads each call's op, root and asyncOp from torch's options structs
    # (shmcoll.option_fields): every op of an all_reduce and a reduce_scatter_tensor, every root of a broadcast,
    # sync and async, gives the reference's result there (the second call of each: the first admits its plan).
    # An asynchronous call gets a Work of its own, which a later call's result does not change.
    reduced = []  # calls of every_op the compiled path took

    def every_op(case, call, dtype, op_name, async_op):
        for n in range(2):
            before = pg._small.taken if compiled is not None else 0
            call(f"{case}#{n}", dtype, 3, op_name, async_op)
        reduced.append((pg._small.taken - before) if compiled is not None else 0)

    for dtype in (torch.float32, torch.int32):
        for op_name in ops_for(dtype):
            for async_op in (False, True):
                for name, call in (("all_reduce", all_reduce), ("reduce_scatter_tensor", reduce_scatter)):
                    cases.run(f"fast_path/every_op/{name}/{dtype}/{op_name}/async={async_op}", every_op,
                              f"every_op/{name}/{dtype}/{op_name}/async={async_op}", call, dtype, op_name, async_op)
    if one_lane_bytes:  # at least sum, product, min and max of both dtypes, both ways, for both collectives
        cases.check("fast_path/every_op/compiled", sum(reduced) >= 4 * 2 * 2 * 2,
                    f"the compiled path took {sum(reduced)} of the {len(reduced)} calls")

    def every_root():
        for root in range(world):
            for async_op in (False, True):
                case = f"fast_path/every_root/{root}/async={async_op}"
                for n in range(2):
                    before = pg._small.taken if compiled is not None else 0
                    tensor = (make_input(case, root, torch.int64, 5) if rank == root
                              else torch.zeros(5, dtype=torch.int64))
                    work = dist.broadcast(tensor, root, async_op=async_op)
                    if async_op:
                        work.wait()
                        later = torch.zeros(3)
                        dist.all_reduce(later)  # runs inline too, after the broadcast's Work was made
                        assert work.result()[0] is tensor, f"{case}: the async Work's result is another call's"
                    _equal(tensor, make_input(case, root, torch.int64, 5), case)
                took = (pg._small.taken - before) if compiled is not None else 0
                assert took == (1 + async_op if one_lane_bytes else 0), f"{case}: the compiled path took {took} calls"

    cases.run("fast_path/every_root", every_root)

    def async_works_own():
        # Every asynchronous call gets a Work of its own, whichever path ran it; one the caller dropped is not
        # handed out again (nothing can observe it, but nothing of it is kept either: tests/async_scenarios.py).
        x, y = torch.ones(3), torch.ones(4)
        works = [dist.all_reduce(x, async_op=True), dist.all_reduce(y, async_op=True)]
        first = weakref.ref(works[0])
        works[0].wait()
        del works[0]
        works.append(dist.all_reduce(x, async_op=True))
        assert first() is None or all(w is not first() for w in works), "a dropped async Work was handed out again"
        assert works[0] is not works[1] and works[0].result()[0] is y and works[1].result()[0] is x, \
            "an async Work is another call's"
        for work in works:
            work.wait()
        _equal(x, torch.full((3,), float(world ** 2)), "fast_path/async_works_own")

    cases.run("fast_path/async_works_own", async_works_own)

    def late_peer():
        # The last rank comes after several wait slices: the compiled path's first wait gives up and the
        # slow wait (finish_one_shot, finish_run of shmcoll.algorithms) finishes the call, with the same result.
        if rank == world - 1:
            time.sleep(0.35)
        before = pg._small.taken if compiled is not None else 0
        call(case, dtype, 7, op_name, False)
        if one_lane_bytes:
            assert pg._small.taken == before + 1, f"{case}: the compiled path did not take the late call"

    for name, call, dtype, op_name in (("all_reduce", all_reduce, torch.float32, "sum"),
                                       ("reduce_scatter_tensor", reduce_scatter, torch.bfloat16, "sum"),
                                       ("broadcast", broadcast, torch.float64, None),
                                       ("all_gather_into_tensor", all_gather, torch.int16, None)):
        case = f"fast_path/{name}/late_peer"
        cases.run(case, late_peer)

    # The barrier takes the compiled path from its first call (it has no plan to admit); a late peer's barrier
    # must still hold everyone back (finish of shmcoll.algorithms.barrier, after the first slice).
    for async_op, late in ((False, False), (True, False), (False, True)):
        case = f"fast_path/barrier/async={async_op}/late={late}"

        def barrier_call():
            before = pg._small.taken if compiled is not None else 0
            seq = pg._state.seq
            if late and rank == world - 1:
                time.sleep(0.35)
            start = time.monotonic()
            work = dist.barrier(async_op=async_op)
            if async_op:
                work.wait()
            held = time.monotonic() - start
            took = (pg._small.taken - before) if compiled is not None else 0
            assert took == (1 if one_lane_bytes else 0), f"{case}: the compiled path took {took} calls"
            assert pg._state.seq == seq + 1 and pg.describe_current() == f"barrier() #{seq + 1}", \
                f"{case}: the group's bookkeeping says {pg.describe_current()!r} after call #{seq + 1}"
            assert not late or rank == world - 1 or held > 0.25, f"{case}: the barrier let rank {rank} go after " \
                f"{held:.3f} s, before the late rank came"

        cases.run(case, barrier_call)
