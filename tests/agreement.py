"""Scenarios where the ranks' own arguments or settings differ, yet Gloo's contract says they agree.

``mixed_settings``: the ranks start with different group-wide settings
(tests/test_agreement.py sets one per job); every rank must compute correct
results with the group's (rank 0's) values, and report what it used.

``split_combinations``: all_to_all(_single) where some ranks pass split sizes
and others do not, or pass explicit ones equal to the even split; Gloo accepts
every such combination, and the results must be Gloo's.
"""
from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from tests.references import assert_equal, make_data, make_input, reference_reduce


def mixed_settings(cases):
    rank, world = dist.get_rank(), dist.get_world_size()
    # Around every threshold the settings move: 1 KiB .. 512 KiB one-shot limits, 64 KiB .. 1 MiB chunks,
    # 64 KiB .. 2 MiB per lane; 3,000,000 floats is the message that went wrong (rank 0's sum, no error).
    for count in (0, 1, 255, 4097, 16385, 70001, 300001, 3_000_000):
        case = f"all_reduce/n={count}"

        def all_reduce():
            inputs = [make_input(case, r, torch.float32, count) for r in range(world)]
            tensor = inputs[rank].clone()
            dist.all_reduce(tensor)
            assert_equal(tensor, reference_reduce(inputs, "sum", torch.float32), "all_reduce")

        cases.run(case, all_reduce)

        case = f"all_gather_into_tensor/n={count}"

        def all_gather_into():
            out = torch.zeros(world * count)
            dist.all_gather_into_tensor(out, make_data(case, rank, torch.float32, count))
            assert_equal(out, torch.cat([make_data(case, r, torch.float32, count) for r in range(world)]), "all_gather")

        cases.run(case, all_gather_into)

        case = f"all_gather/n={count}"

        def all_gather_list():
            outs = [torch.zeros(count) for _ in range(world)]
            dist.all_gather(outs, make_data(case, rank, torch.float32, count))
            for r in range(world):
                assert_equal(outs[r], make_data(case, r, torch.float32, count), f"all_gather slot {r}")

        cases.run(case, all_gather_list)

    for count in (1, 20001, 600001):  # 600001 floats: above every chunk and channel size the tests set
        case = f"send_recv/n={count}"

        def send_recv():
            # A ring: each rank sends to the next and receives from the previous, both at once.
            to, frm = (rank + 1) % world, (rank - 1) % world
            out = torch.zeros(count)
            ops = [dist.P2POp(dist.isend, make_data(case, rank, torch.float32, count), to),
                   dist.P2POp(dist.irecv, out, frm)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            assert_equal(out, make_data(case, frm, torch.float32, count), f"message from rank {frm}")

        cases.run(case, send_recv)

    from shmcoll import _env

    return {"settings": _env.group_wide(dist.group.WORLD.placement.settings)}


def split_combinations(cases):
    """Every combination of (no splits, explicit even splits) over the ranks, and uneven splits where
    some ranks leave out the side that is even for them; list-form all_to_all with sizes that are even
    on some ranks and not on others. Each against Gloo."""
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    for rows in (0, 1, 5, 3001):
        for explicit in itertools.product((False, True), repeat=world):
            case = f"all_to_all_single/rows={rows}/explicit={''.join('ES'[e] for e in explicit)}"

            def even():
                data = make_data(case, rank, torch.float32, rows * world * 2).reshape(-1, 2)
                splits = [rows] * world if explicit[rank] else None
                out = torch.full((rows * world, 2), -1.0)
                dist.all_to_all_single(out, data, output_split_sizes=splits, input_split_sizes=splits)
                theirs = torch.full((rows * world, 2), -2.0)
                dist.all_to_all_single(theirs, data, output_split_sizes=splits, input_split_sizes=splits,
                                       group=gloo)
                assert_equal(out, theirs, "shm vs gloo")

            cases.run(case, even)

    # Rank r sends (r + 1) * rows to every rank: its input side is even, its output side is not (from 3
    # ranks on), so a rank may leave out its input splits and must still agree with those that pass them.
    for rows in (1, 7, 1001):
        for leave_out_input in itertools.product((False, True), repeat=world):
            case = f"all_to_all_single/rows={rows}/input_splits_left_out={''.join('NY'[x] for x in leave_out_input)}"

            def uneven():
                send = [(rank + 1) * rows] * world
                recv = [(r + 1) * rows for r in range(world)]
                data = make_data(case, rank, torch.float32, sum(send))
                input_splits = None if leave_out_input[rank] else send
                out = torch.full((sum(recv),), -1.0)
                dist.all_to_all_single(out, data, output_split_sizes=recv, input_split_sizes=input_splits)
                theirs = torch.full((sum(recv),), -2.0)
                dist.all_to_all_single(theirs, data, output_split_sizes=recv, input_split_sizes=input_splits,
                                       group=gloo)
                assert_equal(out, theirs, "shm vs gloo")

            cases.run(case, uneven)

    # The last rank gives itself one row more than its own output has room for: every rank refuses it,
    # and no byte lands past that output (the rank's own block is copied only once the sizes agree).
    rows = 5
    case = "all_to_all_single/own_block_larger_than_its_place"

    def own_block_too_large():
        last = rank == world - 1
        send = [rows] * world
        if last:
            send[rank] += 1
        room = torch.full((rows * world + 4, 2), 7.0)  # the output, then rows that must stay untouched
        mine = make_data(case, rank, torch.float32, 2 * sum(send)).reshape(-1, 2)
        try:
            dist.all_to_all_single(room[:rows * world], mine, output_split_sizes=[rows] * world,
                                   input_split_sizes=send)
        except ValueError as error:
            expected = f"rank {world - 1} sends {8 * (rows + 1)} bytes to rank {world - 1}, which expects {8 * rows}"
            assert expected in str(error), error
        else:
            raise AssertionError("an own block larger than its place was accepted")
        assert torch.equal(room[rows * world:], torch.full((4, 2), 7.0)), "bytes written past the output"

    cases.run(case, own_block_too_large)

    # List form: rank 0's tensors all have one size, so it looks "uniform" to itself; the others' do not.
    # Gloo refuses tensors of different sizes in this form (NCCL and MPI take them), so the reference is
    # the inputs themselves.
    for rows in (1, 3001):
        case = f"all_to_all/rows={rows}/uniform_on_rank_0_only"

        def list_form():
            def size(src, dst):
                return rows if 0 in (src, dst) else rows * (src + dst + 1)

            ins = [make_data(f"{case}/{rank}->{j}", rank, torch.float32, size(rank, j)) for j in range(world)]
            outs = [torch.full((size(j, rank),), -1.0) for j in range(world)]
            dist.all_to_all(outs, ins)
            for j in range(world):
                assert_equal(outs[j], make_data(f"{case}/{j}->{rank}", j, torch.float32, size(j, rank)),
                             f"all_to_all from {j}")

        cases.run(case, list_form)
