"""Scenarios run inside spawned ranks (see tests/worker.py); each records cases. Here the collectives against
their references, case by case (the all-reduce matrix, data movement, rooted and scattered, spans, overlap),
each with the count of cases it plans (``<scenario>_planned``), and the inputs and references every scenario
module builds on. Each other concern has a module of its own: the call forms (api_scenarios), point-to-point
(p2p_scenarios), groups made and destroyed (group_scenarios), which path a call takes (fast_path_scenarios),
lanes (lane_scenarios).

Inputs are generated from (case, rank) seeds, so every rank can rebuild every
other rank's input and compute the expected result locally. Values are chosen
so that sums and products are exact in every dtype and any order; results are
then also compared with Gloo's where Gloo supports the combination.
"""
from __future__ import annotations

import functools
import os
import zlib

import torch
import torch.distributed as dist

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


