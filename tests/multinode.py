"""Scenarios for groups spanning several (simulated) nodes: SHMCOLL_HOSTID differs between ranks.

Every case is checked against a local reference built from (case, rank) seeds,
as in tests/references.py.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from tests.lane_scenarios import lane_threads
from tests.movement_scenarios import check_all_gather_into_tensor, check_barrier, check_broadcast
from tests.references import R, assert_equal, make_data, make_input, reference_reduce, rows_received, split_rows

# Environment of the multi-node jobs: a 4 KiB chunk reaches the multi-chunk paths with
# small inputs, and 4 KiB segments the pipelines of several segments; the matrix's 5003
# elements exceed both.
SMALL_CHUNKS = {"SHMCOLL_CHUNK_BYTES": "4096", "SHMCOLL_SMALL_BYTES": "1024", "SHMCOLL_SEGMENT_BYTES": "4096"}


def _backend(group=None):
    """This rank's shm group ``group`` (default: the default group), whose placement the checks read: the group
    is its own shm object (ProcessGroupShm)."""
    return dist.group.WORLD if group is None else group


def _layout(pg) -> dict:
    where = pg.placement
    across = type(where).__name__ == "Nodes"  # several nodes: arenas inside, Gloo rails and a flat group
    return {"hierarchical": across, "flat_gloo": across,
            "nodes": where.nodes if across else None,
            "tcp_bytes": sum(link.sent for link in (where.links.rail, where.links.leaders) if link is not None)
            if across else 0,
            "lane_threads": len(lane_threads())}  # started by the first collective split over lanes


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
                    assert_equal(tensor, reference_reduce(inputs, op_name, dtype), "all_reduce")

                cases.run(case, all_reduce)

                case = f"reduce_scatter_tensor/{str(dtype)[6:]}/{op_name}/n={count}"

                def reduce_scatter():
                    inputs = [make_input(case, r, dtype, count * world, op_name) for r in range(world)]
                    out = torch.full((count,), 3, dtype=dtype)
                    dist.reduce_scatter_tensor(out, inputs[rank], op=op)
                    expected = reference_reduce(inputs, op_name, dtype)[rank * count:(rank + 1) * count]
                    assert_equal(out, expected, "reduce_scatter_tensor")

                cases.run(case, reduce_scatter)

    def all_reduce_async_and_strided():
        base = torch.stack([make_input("nc", rank, torch.float32, 999), torch.full((999,), -7.0)], dim=1)
        column = base[:, 0]
        second = make_input("second", rank, torch.float32, 33)
        w1 = dist.all_reduce(column, async_op=True)
        w2 = dist.all_reduce(second, async_op=True)
        w1.wait()
        w2.wait()
        expected = reference_reduce([make_input("nc", r, torch.float32, 999) for r in range(world)], "sum",
                                    torch.float32)
        assert_equal(base[:, 0], expected, "strided all_reduce")
        assert_equal(base[:, 1], torch.full((999,), -7.0), "untouched neighbours")
        assert_equal(second, reference_reduce([make_input("second", r, torch.float32, 33) for r in range(world)], "sum",
                                              torch.float32), "second async all_reduce")

    cases.run("all_reduce/async_strided", all_reduce_async_and_strided)

    def premul_sum():
        t = make_input("premul", rank, torch.float32, 41)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        expected = reference_reduce([make_input("premul", r, torch.float32, 41) for r in range(world)], "sum",
                                    torch.float32) * 0.5
        assert_equal(t, expected, "premul_sum")

    cases.run("all_reduce/premul_sum", premul_sum)

    for dtype in (torch.float32, torch.bool, torch.complex64):
        for count in counts:
            for root in range(world):
                case = f"broadcast/{str(dtype)[6:]}/n={count}/root={root}"
                cases.run(case, check_broadcast, case, rank, root, dtype, count)

            case = f"all_gather_into_tensor/{str(dtype)[6:]}/n={count}"
            cases.run(case, check_all_gather_into_tensor, case, rank, world, dtype, count)

    cases.run("barrier", check_barrier, rank, world)

    # all_to_all: even and uneven splits (some blocks empty), list form; gather, scatter and reduce at every root.
    def all_to_all_single():
        n = 3
        inp = torch.arange(world * n, dtype=torch.float32) + 100 * rank
        out = torch.empty(world * n)
        dist.all_to_all_single(out, inp)
        expected = torch.cat([torch.arange(rank * n, (rank + 1) * n, dtype=torch.float32) + 100 * r
                              for r in range(world)])
        assert_equal(out, expected, "all_to_all_single")

    cases.run("all_to_all_single", all_to_all_single)

    for unit in (1, 7, int(big)):
        case = f"all_to_all_single/splits/rows={unit}"

        def all_to_all_splits():
            table = [[(r + j + unit) % 3 * unit for j in range(world)] for r in range(world)]  # some zero
            send, recv = table[rank], [table[r][rank] for r in range(world)]
            out = torch.full((sum(recv), 2), -1.0)
            dist.all_to_all_single(out, split_rows(case, rank, table, 2), output_split_sizes=recv,
                                   input_split_sizes=send)
            assert_equal(out, rows_received(case, rank, table, 2), "all_to_all_single with splits")

        cases.run(case, all_to_all_splits)

        case = f"all_to_all/n={unit}"

        def all_to_all_list():
            def count(src, dst):
                return unit * (1 + (src + dst) % 2)

            ins = [make_data(f"{case}/{rank}->{j}", rank, torch.int64, count(rank, j)) for j in range(world)]
            outs = [torch.zeros(count(r, rank), dtype=torch.int64) for r in range(world)]
            dist.all_to_all(outs, ins)
            for r in range(world):
                assert_equal(outs[r], make_data(f"{case}/{r}->{rank}", r, torch.int64, count(r, rank)),
                             f"all_to_all from {r}")

        cases.run(case, all_to_all_list)

        for root in range(world):
            case = f"gather/n={unit}/root={root}"

            def gather():
                tensor = make_data(case, rank, torch.float32, unit)
                outs = [torch.zeros(unit) for _ in range(world)] if rank == root else None
                dist.gather(tensor, outs, dst=root)
                if rank == root:
                    for r in range(world):
                        assert_equal(outs[r], make_data(case, r, torch.float32, unit), f"gather slot {r}")

            cases.run(case, gather)

            case = f"scatter/n={unit}/root={root}"

            def scatter():
                out = torch.zeros(unit, dtype=torch.bfloat16)
                ins = [make_data(case, r, torch.bfloat16, unit) for r in range(world)] if rank == root else None
                dist.scatter(out, ins, src=root)
                assert_equal(out, make_data(case, rank, torch.bfloat16, unit), "scatter")

            cases.run(case, scatter)

            case = f"reduce/n={unit}/root={root}"

            def reduce():
                inputs = [make_input(case, r, torch.float32, unit) for r in range(world)]
                t = inputs[rank].clone()
                dist.reduce(t, dst=root)
                expected = reference_reduce(inputs, "sum", torch.float32) if rank == root else inputs[rank]
                assert_equal(t, expected, "reduce")

            cases.run(case, reduce)

    def all_to_all_sizes_disagree():
        # Rank 0 expects one row more from the last rank (on another node) than it sends: every rank raises
        # the same error before any data moves (Gloo itself would end the process), and the group goes on.
        recv = [2] * world
        if rank == 0:
            recv[-1] += 1
        try:
            dist.all_to_all_single(torch.zeros(sum(recv)), torch.ones(2 * world), output_split_sizes=recv,
                                   input_split_sizes=[2] * world)
        except ValueError as error:
            assert f"rank {world - 1} sends 8 bytes to rank 0, which expects 12 bytes" in str(error), error
        else:
            raise AssertionError("sizes that disagree were not refused")
        all_to_all_single()

    cases.run("all_to_all_single/sizes_disagree", all_to_all_sizes_disagree)

    def all_to_all_small_and_large_senders():
        # Even ranks send a row to each rank, odd ranks 300 (above SHMCOLL_SMALL_BYTES): with the ranks
        # interleaved, one node's leader carries its blocks with its sizes and the other's does not.
        rows = [1 if r % 2 == 0 else 300 for r in range(world)]
        data = make_data("mixed-a2a", rank, torch.float32, rows[rank] * world * 2).reshape(-1, 2)
        out = torch.full((sum(rows), 2), -1.0)
        dist.all_to_all_single(out, data, output_split_sizes=rows, input_split_sizes=[rows[rank]] * world)
        expected = torch.cat([make_data("mixed-a2a", r, torch.float32, rows[r] * world * 2).reshape(-1, 2)
                              [rank * rows[r]:(rank + 1) * rows[r]] for r in range(world)])
        assert_equal(out, expected, "all_to_all_single, small and large senders")

    cases.run("all_to_all_single/small_and_large_senders", all_to_all_small_and_large_senders)

    def gather_strided_outputs():
        grid = torch.zeros(101, world)
        dist.gather(make_data("gstrided", rank, torch.float32, 101), [grid[:, r] for r in range(world)] if rank == 0
                    else None, dst=0)
        for r in range(world if rank == 0 else 0):
            assert_equal(grid[:, r], make_data("gstrided", r, torch.float32, 101), f"strided output {r}")

    cases.run("gather/strided_outputs", gather_strided_outputs)

    def all_gather_list():
        outs = [torch.zeros(9, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(outs, make_data("agl", rank, torch.int64, 9))
        for r in range(world):
            assert_equal(outs[r], make_data("agl", r, torch.int64, 9), f"all_gather slot {r}")

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
        assert_equal(t, expected, "all_reduce")
        assert_equal(g, expected.repeat(world), "all_gather_into_tensor after it")

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
                        assert_equal(tensor, expected, "all_reduce")

                    cases.run(case, all_reduce)

                case = f"group {name}/all_gather_into_tensor/{str(dtype)[6:]}/n={count}"

                def all_gather():
                    out = torch.zeros(len(members) * count, dtype=dtype)
                    dist.all_gather_into_tensor(out, make_data(case, rank, dtype, count), group=group)
                    assert_equal(out, torch.cat([make_data(case, r, dtype, count) for r in members]),
                                 "all_gather_into_tensor")

                cases.run(case, all_gather)

                for root in members:  # global rank, as dist.broadcast takes it
                    case = f"group {name}/broadcast/{str(dtype)[6:]}/n={count}/root={root}"

                    def broadcast():
                        expected = make_data(case, root, dtype, count)
                        t = expected.clone() if rank == root else torch.zeros(count, dtype=dtype)
                        dist.broadcast(t, src=root, group=group)
                        assert_equal(t, expected, "broadcast")

                    cases.run(case, broadcast)
    return {"layouts": layouts}


# What each plan must send from a node to the other, per call, in a job of two nodes: the bytes of
# every collective of ``link_bytes`` (S: the size below) that the best plan moves across the link.
LINK_BYTES_PER_CALL = {  # op -> (fraction of S that node 0 sends, that node 1 sends)
    "all_reduce": (1, 1), "broadcast": (1, 0), "reduce": (0, 1), "all_gather_into_tensor": (0.5, 0.5),
    "reduce_scatter_tensor": (0.5, 0.5), "gather": (0, 0.5), "scatter": (0.5, 0), "all_to_all_single": (1, 1),
    # Smaller, so that what its leaders' size headers carry beside it would show (their room for small
    # blocks must not stay at a small one's size once the calls are large).
    "all_to_all_single of S/16": (1 / 16, 1 / 16),
    "barrier": (0, 0),
}


def link_bytes(cases, size: str = "4194304", calls: str = "4"):
    """Each collective of LINK_BYTES_PER_CALL on S bytes (the nccl-tests size: the tensor, the gathered
    output, the scattered input, each rank's all_to_all input), correct against a local reference; local rank 0 of each node reports its
    veth end's transmitted bytes per call ($GLOO_SOCKET_IFNAME: two nodes in two network namespaces)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    S, calls = int(size), int(calls)
    per_rank = S // 4 // world  # float32 elements of one rank's block
    counter = f"/sys/class/net/{os.environ['GLOO_SOCKET_IFNAME']}/statistics/tx_bytes"
    sent = {}

    def run(op):
        if op == "all_reduce":
            t = make_data("lb", rank, torch.float32, S // 4)
            dist.all_reduce(t)
            return t, reference_reduce([make_data("lb", r, torch.float32, S // 4) for r in range(world)], "sum",
                                       torch.float32)
        if op == "broadcast":
            t = make_data("lb", 0, torch.float32, S // 4) if rank == 0 else torch.zeros(S // 4)
            dist.broadcast(t, 0)
            return t, make_data("lb", 0, torch.float32, S // 4)
        if op == "reduce":
            t = make_data("lb", rank, torch.float32, S // 4)
            dist.reduce(t, 0)
            expected = reference_reduce([make_data("lb", r, torch.float32, S // 4) for r in range(world)], "sum",
                                        torch.float32)
            return (t, expected) if rank == 0 else (t, make_data("lb", rank, torch.float32, S // 4))
        if op == "all_gather_into_tensor":
            out = torch.zeros(world * per_rank)
            dist.all_gather_into_tensor(out, make_data("lb", rank, torch.float32, per_rank))
            return out, torch.cat([make_data("lb", r, torch.float32, per_rank) for r in range(world)])
        if op == "reduce_scatter_tensor":
            out = torch.zeros(per_rank)
            dist.reduce_scatter_tensor(out, make_data("lb", rank, torch.float32, world * per_rank))
            whole = reference_reduce([make_data("lb", r, torch.float32, world * per_rank) for r in range(world)], "sum",
                                     torch.float32)
            return out, whole[rank * per_rank:(rank + 1) * per_rank]
        if op == "gather":
            outs = [torch.zeros(per_rank) for _ in range(world)] if rank == 0 else None
            dist.gather(make_data("lb", rank, torch.float32, per_rank), outs, dst=0)
            if rank != 0:
                return torch.zeros(0), torch.zeros(0)
            return torch.cat(outs), torch.cat([make_data("lb", r, torch.float32, per_rank) for r in range(world)])
        if op == "scatter":
            out = torch.zeros(per_rank)
            ins = [make_data("lb", r, torch.float32, per_rank) for r in range(world)] if rank == 0 else None
            dist.scatter(out, ins, src=0)
            return out, make_data("lb", rank, torch.float32, per_rank)
        if op.startswith("all_to_all_single"):
            n = S // 4 // (16 if op.endswith("S/16") else 1)
            out = torch.zeros(n)
            dist.all_to_all_single(out, make_data("lb", rank, torch.float32, n))
            part = n // world
            return out, torch.cat([make_data("lb", r, torch.float32, n)[rank * part:(rank + 1) * part]
                                   for r in range(world)])
        dist.barrier()
        return torch.zeros(0), torch.zeros(0)

    for op in LINK_BYTES_PER_CALL:
        def measure(op=op):
            result, expected = run(op)  # once outside the count: nothing left from what came before
            assert_equal(result, expected, op)
            dist.barrier()
            before = int(open(counter).read())
            for _ in range(calls):
                run(op)
            dist.barrier()
            sent[op] = (int(open(counter).read()) - before) / calls

        cases.run(f"link_bytes/{op}", measure)
    return {**_layout(_backend()), "sent_per_call": sent, "size": S}


def alltoall_sizes(cases):
    """all_to_all_single at the default SHMCOLL_SMALL_BYTES, sizes growing and shrinking (the leaders' headers
    learn their room from the last call: blocks that outgrow it follow the header, later ones ride in it),
    uneven per sender, against the inputs themselves."""
    rank, world = dist.get_rank(), dist.get_world_size()

    def moving(case: str, count):
        """``count(src, dst)``: the elements rank src sends rank dst."""
        def run():
            send = [count(rank, d) for d in range(world)]
            recv = [count(s, rank) for s in range(world)]
            data = make_data(case, rank, torch.float32, sum(send))
            out = torch.full((sum(recv),), -1.0)
            dist.all_to_all_single(out, data, output_split_sizes=recv, input_split_sizes=send)
            pieces = []
            for s in range(world):
                theirs = make_data(case, s, torch.float32, sum(count(s, d) for d in range(world)))
                start = sum(count(s, d) for d in range(rank))
                pieces.append(theirs[start:start + count(s, rank)])
            assert_equal(out, torch.cat(pieces), "all_to_all_single")
        cases.run(case, run)

    for step, rows in enumerate((1, 500, 500, 7000, 3, 5000, 5000, 20000)):
        moving(f"all_to_all_single/step={step}/rows={rows}",
               lambda src, dst, rows=rows: (src * 3 + dst) % 4 * rows // 2)  # some zero, some uneven

    # Sizes that disagree after a large all_to_all (the leaders' header back at its first room), a
    # receiver expecting more or fewer bytes than its sender gives (Gloo would end the process on the
    # latter), between nodes and inside one: the same error on every rank, and the group goes on.
    def disagreeing(case: str, sender: int, receiver: int, rows: int, extra: int):
        def run():  # ``receiver`` expects ``extra`` rows more (fewer, if negative) than ``sender`` sends it
            send, recv = [rows] * world, [rows] * world
            if rank == receiver:
                recv[sender] += extra
            out = torch.zeros(sum(recv), 2)
            try:
                dist.all_to_all_single(out, make_data(case, rank, torch.float32, 2 * rows * world).reshape(-1, 2),
                                       output_split_sizes=recv, input_split_sizes=send)
            except ValueError as error:
                expected = (f"rank {sender} sends {8 * rows} bytes to rank {receiver}, which expects "
                            f"{8 * (rows + extra)} bytes from it")
                assert expected in str(error), error
            else:
                raise AssertionError("sizes that disagree were not refused")
        cases.run(case, run)

    def agreeing(case: str, rows: int):
        def run():
            data = make_data(case, rank, torch.float32, 2 * rows * world).reshape(-1, 2)
            out = torch.full((rows * world, 2), -1.0)
            dist.all_to_all_single(out, data)
            expected = torch.cat([make_data(case, s, torch.float32, 2 * rows * world).reshape(-1, 2)
                                  [rank * rows:(rank + 1) * rows] for s in range(world)])
            assert_equal(out.reshape(-1), expected.reshape(-1), "all_to_all_single")
        cases.run(case, run)

    disagreeing("all_to_all_single/after_large/more_than_sent", world - 1, 0, 3000, 1)
    disagreeing("all_to_all_single/after_large/fewer_than_sent", 0, world - 1, 3000, -1)
    agreeing("all_to_all_single/after_large/agree", 3000)
    disagreeing("all_to_all_single/after_large/in_a_node", world - 2, world - 1, 3000, 1)
    agreeing("all_to_all_single/after_large/small", 3)
    agreeing("all_to_all_single/after_large/small_again", 5)

    # Large ones of the same sizes, as a model repeats them: from the third, the blocks leave at once at
    # the sizes agreed before (a rank whose sizes changed sends them a few bytes short). Then
    # sizes that change on every rank alike, and sizes that change on one rank only: the call starts
    # again through the leaders, which move the new sizes or name the ranks that disagree.
    for repeat in range(4):
        agreeing(f"all_to_all_single/repeated/{repeat}", 2500)
    agreeing("all_to_all_single/repeated/changed_everywhere", 2600)
    for repeat in range(3):
        agreeing(f"all_to_all_single/repeated_again/{repeat}", 2600)
    disagreeing("all_to_all_single/repeated_again/changed_on_one_rank", world - 1, 0, 2600, 1)
    for repeat in range(3):
        agreeing(f"all_to_all_single/repeated_after_error/{repeat}", 2600)

    # Repeated sizes with blocks of 0 and 4 bytes among large ones (shorter than the tail a changed rank
    # leaves out: they travel padded), then only the 4-byte blocks grow, on every rank alike.
    def uneven(tiny: int):
        return lambda src, dst: (0, tiny, 20000, 15001)[(src * 3 + dst) % 4]

    for repeat in range(4):
        moving(f"all_to_all_single/repeated_uneven/{repeat}", uneven(1))
    moving("all_to_all_single/repeated_uneven/tiny_blocks_grew", uneven(2))
    moving("all_to_all_single/repeated_uneven/again", uneven(2))
