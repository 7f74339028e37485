"""Single-copy transfers inside a node (peers read each other's buffers): forced on and off, the collective
matrix against its references; refused by the kernel, the copy path, said at INFO."""
import re

import pytest

from shmcoll.placement.node import READ_COST_LIMIT, SINGLE_COPY_KINDS, SINGLE_COPY_SPANS, single_copy_spans
from shmcoll.single_copy import Verdict
from tests import (all_reduce_scenarios, movement_scenarios, overlap_scenarios, p2p_scenarios, rooted_scenarios,
                   single_copy_scenarios)
from tests.harness import assert_job_passes, spawn

# 600001 elements: past every span of placement.node.SINGLE_COPY_SPANS for 4-byte types but the
# all-reduce's 32 MiB, and past one chunk, so that single copy's pieces loop.
# (scenario, the module that holds it, its arguments, its count of cases at a world size)
SCENARIOS = [
    ("allreduce_matrix", all_reduce_scenarios, ["600001"],
     lambda world: all_reduce_scenarios.allreduce_matrix_cases(world, "600001")),
    ("data_movement", movement_scenarios, ["600001"],
     lambda world: movement_scenarios.data_movement_cases(world, "600001")),
    ("rooted_and_scattered", rooted_scenarios, [], rooted_scenarios.rooted_and_scattered_cases),
    ("in_place_overlap", overlap_scenarios, [], lambda world: overlap_scenarios.in_place_overlap_cases()),
    ("point_to_point", p2p_scenarios, [], p2p_scenarios.point_to_point_cases),
]


@pytest.mark.parametrize("mode", ["1", "0"], ids=["single-copy", "copy"])
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("scenario, module, args, cases", SCENARIOS, ids=[s for s, _, _, _ in SCENARIOS])
def test_collectives_on_each_path(scenario, module, args, cases, world_size, mode):
    env = {"SHMCOLL_SINGLE_COPY": mode, "SHMCOLL_CHUNK_BYTES": "65536", "SHMCOLL_LOG_LEVEL": "INFO"}
    result = spawn(f"{module.__name__}:{scenario}", world_size, env=env, args=args, timeout=300)
    assert_job_passes(result, min_cases=cases(world_size))
    expected = "single copy: every size (SHMCOLL_SINGLE_COPY=1)" if mode == "1" else \
        "single copy: off (SHMCOLL_SINGLE_COPY=0)"
    assert expected in result.outputs[0], result.outputs[0]


def test_refused_by_the_kernel_uses_the_copy_path():
    """Rank 1 is not dumpable and rank 0 lacks CAP_SYS_PTRACE: rank 0 may not read rank 1's memory. The
    probe finds it, every rank takes the copy path, and rank 0 says why at INFO."""
    result = spawn("tests.movement_scenarios:data_movement", 2, timeout=300,
                   env={"SHMCOLL_SINGLE_COPY": "1", "SHMCOLL_LOG_LEVEL": "INFO", "SHMCOLL_CHUNK_BYTES": "65536"},
                   rank_env=lambda rank: {"SHMCOLL_TEST_NOT_DUMPABLE": "1"} if rank == 1 else {},
                   rank_prefix=lambda rank: ["setpriv", "--bounding-set", "-sys_ptrace"] if rank == 0 else [])
    assert_job_passes(result, min_cases=movement_scenarios.data_movement_cases(2))
    assert ("single-copy transfers are not allowed between the ranks of this node, so large collectives copy "
            "through shared memory: rank 0: process_vm_readv of local rank 1") in result.outputs[0], result.outputs[0]
    assert "Operation not permitted" in result.outputs[0]
    assert "single copy: off (rank 0: process_vm_readv" in result.outputs[0], result.outputs[0]


def test_where_a_read_costs_two_copies_the_copy_path_is_kept():
    """The rule of placement.node.single_copy_spans: a node that reads its peers cheaply uses every measured
    span; one whose reads cost two copies or more keeps the copy path; refused, nothing; forced, every size
    of every collective that has a single-copy schedule, whatever the cost."""
    assert single_copy_spans(Verdict(None, 1.0), "auto") == SINGLE_COPY_SPANS
    assert single_copy_spans(Verdict(None, READ_COST_LIMIT), "auto") == {}
    assert single_copy_spans(Verdict("refused", 0.0), "auto") == {}
    assert single_copy_spans(Verdict(None, 9.0), "1") == {kind: (0, None) for kind in SINGLE_COPY_KINDS}


def test_where_reads_are_cheap_each_size_takes_its_path():
    """The default mode on a node whose reads cost one copy (the probe's answer set by a test hook): each
    collective with a span changes path at its edges, each size on every rank alike, and every result is
    right on both sides."""
    result = spawn("tests.single_copy_scenarios:around_spans", 3, timeout=300,
                   env={"TEST_READ_COST": "1.0", "SHMCOLL_LOG_LEVEL": "INFO"})
    assert_job_passes(result, min_cases=single_copy_scenarios.around_spans_cases())
    assert "single copy: a read costs 1.00 copies here; all_gather from 16 KiB" in result.outputs[0], \
        result.outputs[0]


def test_the_node_measures_what_a_read_costs_and_chooses_by_it():
    """In the default mode the group's summary gives the cost its ranks measured, and single copy is used
    where the rule gives it for that cost; the matrix passes on the paths chosen."""
    result = spawn("tests.movement_scenarios:data_movement", 2, timeout=300, args=["600001"],
                   env={"SHMCOLL_LOG_LEVEL": "INFO", "SHMCOLL_CHUNK_BYTES": "65536"})
    assert_job_passes(result, min_cases=movement_scenarios.data_movement_cases(2, "600001"))
    found = re.search(r"single copy: a read costs ([0-9.]+) copies here; (.*)", result.outputs[0])
    assert found, result.outputs[0]
    cost = float(found.group(1))
    assert cost > 0
    if abs(cost - READ_COST_LIMIT) > 0.01:  # the summary rounds the cost to 0.01
        expected = "all_gather from 16 KiB" if cost < READ_COST_LIMIT else "off (the copy path is faster)"
        assert found.group(2).startswith(expected), found.group(0)
