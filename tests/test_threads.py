"""The collective matrix with several threads per rank (``SHMCOLL_THREADS``), on however many cores.

On the 2-core machine this oversubscribes (3 ranks x 4 threads), which is the
point: lanes must pair, fence and finish whatever the scheduling. Small chunks
and a 4 KiB lane minimum put every multi-chunk path of every lane-split
collective within reach of small inputs; the scenarios' values are exact under
any order, so each result must equal the reference bit for bit
(tests/unit/test_schedules.py checks bitwise equality with one thread on
random data).
"""
import pytest

from tests import all_reduce_scenarios, lane_scenarios, movement_scenarios, overlap_scenarios, rooted_scenarios
from tests.harness import assert_job_passes, shm_entries, spawn

LANES = {"SHMCOLL_CHUNK_BYTES": "8192", "SHMCOLL_SMALL_BYTES": "1024", "SHMCOLL_THREAD_BYTES": "4096"}
# One-shots split into lanes (allreduce.one_shot_limit): from 8 KiB (two lanes of 4 KiB) to 16 KiB an all-reduce
# is one step on each lane; 3001 elements of 4 bytes and 1000 of 16 fall there.
ONE_SHOT_LANES = {"SHMCOLL_CHUNK_BYTES": "65536", "SHMCOLL_SMALL_BYTES": "16384", "SHMCOLL_THREAD_BYTES": "4096"}


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("world_size", [2, 3])
def test_all_reduce_matrix(world_size, threads):
    before = shm_entries()
    result = spawn("tests.all_reduce_scenarios:allreduce_matrix", world_size,
                   env={**LANES, "SHMCOLL_THREADS": str(threads)}, args=["20011"])
    assert_job_passes(result, min_cases=all_reduce_scenarios.allreduce_matrix_cases(world_size, "20011"))
    assert shm_entries() - before == set()


@pytest.mark.parametrize("threads", [3, 4])
def test_all_reduce_matrix_one_shot_over_lanes(threads):
    result = spawn("tests.all_reduce_scenarios:allreduce_matrix", 3,
                   env={**ONE_SHOT_LANES, "SHMCOLL_THREADS": str(threads)}, args=["3001"])
    assert_job_passes(result, min_cases=all_reduce_scenarios.allreduce_matrix_cases(3, "3001"))


# Each scenario of the other collectives at 3 ranks, and the cases it runs on each rank.
OTHER_COLLECTIVES = {
    "data_movement": (movement_scenarios, lambda: movement_scenarios.data_movement_cases(3)),
    "rooted_and_scattered": (rooted_scenarios, lambda: rooted_scenarios.rooted_and_scattered_cases(3)),
    "in_place_overlap": (overlap_scenarios, overlap_scenarios.in_place_overlap_cases),
}


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("scenario", list(OTHER_COLLECTIVES))
def test_other_collectives(scenario, threads):
    module, cases = OTHER_COLLECTIVES[scenario]
    result = spawn(f"{module.__name__}:{scenario}", 3, env={**LANES, "SHMCOLL_THREADS": str(threads)})
    assert_job_passes(result, min_cases=cases())


# Single copy forced on (every size): its reads and reductions split over the lanes from 8 KiB per rank; the
# all-reduce's one-shot stays below that, so only single copy starts the lane threads.
SINGLE_COPY_LANES = {**LANES, "SHMCOLL_SINGLE_COPY": "1"}


@pytest.mark.parametrize("world_size, threads", [(2, 3), (3, 2)])
def test_single_copy_over_lanes(world_size, threads):
    before = shm_entries()
    result = spawn("tests.lane_scenarios:single_copy_over_lanes", world_size,
                   env={**SINGLE_COPY_LANES, "SHMCOLL_THREADS": str(threads)}, timeout=300)
    assert_job_passes(result, min_cases=lane_scenarios.single_copy_over_lanes_cases(world_size))
    assert shm_entries() - before == set()


def test_ranks_asking_for_different_thread_counts_agree():
    """Lanes must pair: a rank with 1 thread and ranks with 4 run with the least (1), correctly."""
    result = spawn("tests.movement_scenarios:data_movement", 3, env=LANES,
                   rank_env=lambda rank: {"SHMCOLL_THREADS": "1" if rank == 1 else "4"})
    assert_job_passes(result, min_cases=movement_scenarios.data_movement_cases(3))


@pytest.mark.parametrize("world_size, threads", [(2, 3), (3, 2)])
def test_compiled_front_over_lanes(world_size, threads):
    """The compiled front splits synchronous collectives over the lanes itself: each taken there, bitwise the
    reference; a late peer settled by Lanes.finish; a mismatch raised on every rank."""
    # Single copy off: where the group's probe finds reads cheap, its span may begin below the lanes' split
    # (broadcast from 8 KiB on the 2-core Xeon, now and then), and those calls are the general path's
    # (tests/test_single_copy.py).
    result = spawn("tests.lane_scenarios:compiled_over_lanes", world_size,
                   env={**LANES, "SHMCOLL_THREADS": str(threads), "SHMCOLL_SINGLE_COPY": "0"})
    assert_job_passes(result, min_cases=lane_scenarios.compiled_over_lanes_cases())


def test_idle_lane_threads_sleep():
    """After a collective split over lanes the lane threads use no CPU, and destroy_process_group ends them."""
    result = spawn("tests.lane_scenarios:lane_threads_sleep", 2, env={"SHMCOLL_THREADS": "4"})
    assert_job_passes(result, min_cases=lane_scenarios.lane_threads_sleep_cases())


# Across nodes: segments of 64 KiB give the node stages of the rails' pipelines 32 KiB per rank, and the leaders'
# plans (nodes of unequal size) reduce and broadcast the whole 80 KiB message on the node, so that every node stage
# that splits runs on two and three lanes.
LANES_ACROSS = {**LANES, "SHMCOLL_SEGMENT_BYTES": "65536"}


@pytest.mark.parametrize("rank_nodes, threads", [([0, 0, 1, 1], 3), ([0, 0, 0, 1], 2)], ids=["2x2-3lanes", "3+1-2lanes"])
def test_node_stages_across_nodes_over_lanes(rank_nodes, threads):
    before = shm_entries()
    result = spawn("tests.multinode:matrix", len(rank_nodes), env={**LANES_ACROSS, "SHMCOLL_THREADS": str(threads)},
                   args=["20011"], rank_env=lambda rank: {"SHMCOLL_HOSTID": f"node{rank_nodes[rank]}"}, timeout=150)
    assert_job_passes(result, min_cases=206)
    for rank, report in enumerate(result.reports):
        alone = rank_nodes.count(rank_nodes[rank]) == 1  # no arena, no lanes
        assert report["hierarchical"] and (report["lane_threads"] == 0 if alone else report["lane_threads"] >= 1), \
            (rank, report["lane_threads"])
    assert shm_entries() - before == set()
