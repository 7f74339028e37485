"""The rooted and the scattering collectives, against local references: reduce (first and last root),
reduce_scatter (list and tensor) over a spread of (dtype, op); gather and scatter (first and last root) and
all_to_all (list and single) over a spread of dtypes; all_to_all_single with uneven splits, against Gloo too."""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.reduction_scenarios import check_reduce, check_reduce_scatter
from tests.references import assert_equal, element_counts, make_data, ops_for, rows_received, split_rows

# (dtype, op name) of the reductions: every kind of dtype, every kind of op.
REDUCTIONS = ((torch.float32, "sum"), (torch.float32, "max"), (torch.bfloat16, "sum"), (torch.float16, "avg"),
              (torch.int64, "sum"), (torch.int32, "bxor"), (torch.uint8, "min"), (torch.bool, "bor"),
              (torch.float64, "product"))
MOVED_DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64)
# Rows per unit of the uneven splits: a row, a few, more than a 4 KiB chunk.
SPLIT_UNITS = (1, 3, 1001)


def _roots(world: int) -> list[int]:
    return sorted({0, world - 1})


def rooted_and_scattered(cases, big: str = "5003"):
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    counts = element_counts(world, int(big))
    for dtype, op_name in REDUCTIONS:
        op = ops_for(dtype)[op_name]
        for count in counts:
            for root in _roots(world):
                case = f"reduce/{str(dtype)[6:]}/{op_name}/n={count}/root={root}"
                cases.run(case, check_reduce, case, rank, world, dtype, op_name, op, count, root)
            case = f"reduce_scatter_tensor/{str(dtype)[6:]}/{op_name}/n={count}"
            cases.run(case, check_reduce_scatter, case, rank, world, dtype, op_name, op, count, False)
            case = f"reduce_scatter/{str(dtype)[6:]}/{op_name}/n={count}"
            cases.run(case, check_reduce_scatter, case, rank, world, dtype, op_name, op, count, True)

    for dtype in MOVED_DTYPES:
        for count in counts:
            for root in _roots(world):
                case = f"gather/{str(dtype)[6:]}/n={count}/root={root}"

                def run_gather():
                    outs = [torch.zeros(count, dtype=dtype) for _ in range(world)] if rank == root else None
                    dist.gather(make_data(case, rank, dtype, count), outs, dst=root)
                    if rank == root:
                        for r in range(world):
                            assert_equal(outs[r], make_data(case, r, dtype, count), f"gather slot {r}")

                cases.run(case, run_gather)
                case = f"scatter/{str(dtype)[6:]}/n={count}/root={root}"

                def run_scatter():
                    out = torch.zeros(count, dtype=dtype)
                    ins = [make_data(case, r, dtype, count) for r in range(world)] if rank == root else None
                    dist.scatter(out, ins, src=root)
                    assert_equal(out, make_data(case, rank, dtype, count), "scatter")

                cases.run(case, run_scatter)

            case = f"all_to_all_single/{str(dtype)[6:]}/n={count}"

            def run_a2a_single():
                rows = count * world
                ins = [make_data(case, r, dtype, rows) for r in range(world)]
                out = torch.zeros(rows, dtype=dtype)
                dist.all_to_all_single(out, ins[rank])
                expected = torch.cat([ins[r][rank * count:(rank + 1) * count] for r in range(world)])
                assert_equal(out, expected, "all_to_all_single")

            cases.run(case, run_a2a_single)

            case = f"all_to_all/{str(dtype)[6:]}/n={count}"

            def run_a2a_list():
                ins = [[make_data(f"{case}/{r}->{j}", r, dtype, count) for j in range(world)] for r in range(world)]
                outs = [torch.zeros(count, dtype=dtype) for _ in range(world)]
                dist.all_to_all(outs, ins[rank])
                for r in range(world):
                    assert_equal(outs[r], ins[r][rank], f"all_to_all from {r}")

            cases.run(case, run_a2a_list)

    for unit in SPLIT_UNITS:
        case = f"all_to_all_single/splits/rows={unit}"

        def run_a2a_splits():
            # Uneven split sizes: rank r sends (r + j + unit) % 4 * unit rows to rank j (some zero).
            table = [[(r + j + unit) % 4 * unit for j in range(world)] for r in range(world)]
            send, recv = table[rank], [table[r][rank] for r in range(world)]
            data = split_rows(case, rank, table, 3)
            out = torch.zeros(sum(recv), 3)
            dist.all_to_all_single(out, data, output_split_sizes=recv, input_split_sizes=send)
            assert_equal(out, rows_received(case, rank, table, 3), "all_to_all_single with splits")
            theirs = torch.zeros(sum(recv), 3)
            dist.all_to_all_single(theirs, data, output_split_sizes=recv, input_split_sizes=send, group=gloo)
            assert_equal(out, theirs, "shm vs gloo")

        cases.run(case, run_a2a_splits)


def rooted_and_scattered_cases(world: int, big: str = "5003") -> int:
    """How many cases ``rooted_and_scattered`` runs on each rank: per size, a reduce per root and both
    reduce_scatters of each reduction; a gather and a scatter per root and both all_to_alls of each dtype; then
    the uneven splits."""
    sizes, roots = len(element_counts(world, int(big))), len(_roots(world))
    return (len(REDUCTIONS) * sizes * (roots + 2) + len(MOVED_DTYPES) * sizes * (2 * roots + 2)
            + len(SPLIT_UNITS))
