"""Collectives whose input and output overlap: the input a block of the output (FSDP's in-place all_gather),
the input also an output, the output inside the input (on every rank or on some): a correct result, on one node
and across nodes."""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.references import assert_equal, make_data, make_input, reference_reduce

OVERLAP_COUNTS = (1, 7, 5003)
INPUT_BLOCKS = ("own", "another")  # which block of an all_gather's output is its input: this rank's, the next's
OUTPUT_LAYOUTS = ("every_ranks", "even_ranks", "next_block")  # where a reduce_scatter's output is in its input
# Across nodes a block of 512 KiB is still being sent when the peers' blocks arrive (one of a few KiB has left).
ALL_TO_ALL_COUNTS = OVERLAP_COUNTS + (1 << 17,)


def in_place_overlap(cases):
    rank, world = dist.get_rank(), dist.get_world_size()
    for count in OVERLAP_COUNTS:
        for block in INPUT_BLOCKS:
            case = f"overlap/all_gather_into_tensor/{block}_block/n={count}"

            def gather_from_a_block():
                # The input is a block of the output: this rank's own (FSDP's in-place form), or the next
                # rank's, whose writes must not reach the input before every peer has read it.
                at = rank if block == "own" else (rank + 1) % world
                out = torch.zeros(world * count)
                out[at * count:(at + 1) * count] = make_input(case, rank, torch.float32, count)
                dist.all_gather_into_tensor(out, out[at * count:(at + 1) * count])
                assert_equal(out, torch.cat([make_input(case, r, torch.float32, count) for r in range(world)]), case)

            cases.run(case, gather_from_a_block)
        case = f"overlap/all_gather/input_is_an_output/n={count}"

        def gather_list_into_its_input():
            # The input is also the output for the last rank's block (a list all_gather).
            source = make_input(case, rank, torch.float32, count)
            outs = [torch.zeros(count) for _ in range(world - 1)] + [source]
            dist.all_gather(outs, source)
            for r in range(world):
                assert_equal(outs[r], make_input(case, r, torch.float32, count), f"{case} slot {r}")

        cases.run(case, gather_list_into_its_input)
        # Output inside the input: its own block on every rank, then only on the even ones, then the next
        # rank's block (which that rank reads) on every rank. A path on which the peers read a rank's input
        # must not let that rank's output overwrite it first, and must be every rank's, though only some
        # overlap.
        for layout in OUTPUT_LAYOUTS:
            case = f"overlap/reduce_scatter_tensor/{layout}/n={count}"

            def scatter_in_place():
                inputs = [make_input(case, r, torch.float32, world * count) for r in range(world)]
                buf = inputs[rank].clone()
                inside = layout != "even_ranks" or rank % 2 == 0
                at = (rank + 1) % world if layout == "next_block" else rank
                out = buf[at * count:(at + 1) * count] if inside else torch.zeros(count)
                dist.reduce_scatter_tensor(out, buf)
                assert_equal(out, reference_reduce(inputs, "sum", torch.float32)[rank * count:(rank + 1) * count], case)

            cases.run(case, scatter_in_place)

    for count in ALL_TO_ALL_COUNTS:
        case = f"overlap/all_to_all_single/even_ranks/n={count}"

        def all_to_all_in_place_on_some():
            inputs = [make_data(case, r, torch.float32, world * count) for r in range(world)]
            buf = inputs[rank].clone()
            out = buf if rank % 2 == 0 else torch.zeros(world * count)
            dist.all_to_all_single(out, buf)
            assert_equal(out, torch.cat([inputs[r][rank * count:(rank + 1) * count] for r in range(world)]), case)

        cases.run(case, all_to_all_in_place_on_some)
        case = f"overlap/all_to_all/even_ranks/n={count}"

        def all_to_all_list_in_place_on_some():
            inputs = [make_data(case, r, torch.float32, world * count) for r in range(world)]
            blocks = list(inputs[rank].clone().chunk(world))
            outs = blocks if rank % 2 == 0 else [torch.zeros(count) for _ in range(world)]
            dist.all_to_all(outs, blocks)
            for r in range(world):
                assert_equal(outs[r], inputs[r][rank * count:(rank + 1) * count], f"{case} from {r}")

        cases.run(case, all_to_all_list_in_place_on_some)


def in_place_overlap_cases() -> int:
    """How many cases ``in_place_overlap`` runs on each rank: per size, an all_gather into each block, one into
    its input, a reduce_scatter of each layout and an all_to_all_single and an all_to_all in place on some
    ranks."""
    return len(OVERLAP_COUNTS) * (len(INPUT_BLOCKS) + 1 + len(OUTPUT_LAYOUTS)) + len(ALL_TO_ALL_COUNTS) * 2
