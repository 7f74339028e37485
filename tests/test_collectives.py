"""all_reduce, broadcast, all_gather and barrier on shm at world sizes 1-4."""
import pytest

from tests import (all_reduce_scenarios, api_scenarios, fast_path_scenarios, lifecycle_scenarios, movement_scenarios,
                   overlap_scenarios, p2p_scenarios, reduction_scenarios, rooted_scenarios)
from tests.harness import assert_job_passes, shm_entries, spawn

# A 4 KiB chunk reaches the multi-chunk paths of every collective with small inputs.
SMALL_CHUNKS = {"SHMCOLL_CHUNK_BYTES": "4096", "SHMCOLL_SMALL_BYTES": "1024"}

# The compatibility tier (TESTING.md, "Every torch") takes each scenario at 3 ranks.
THREE = pytest.param(3, marks=pytest.mark.compat)


# scenario -> the module that holds it, and its count of cases (``<scenario>_cases``)
OTHER_COLLECTIVES = {"data_movement": movement_scenarios, "rooted_and_scattered": rooted_scenarios}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("config", ["default", "small_chunks"])
def test_all_reduce_matrix(world_size, config):
    before = shm_entries()
    env = SMALL_CHUNKS if config == "small_chunks" else {}
    # 300001 elements exceed the default 512 KiB chunk for every dtype wider than one byte.
    big = "5003" if config == "small_chunks" else "300001"
    result = spawn("tests.all_reduce_scenarios:allreduce_matrix", world_size, env=env, args=[big])
    assert_job_passes(result, min_cases=all_reduce_scenarios.allreduce_matrix_cases(world_size, big))
    assert shm_entries() - before == set()


@pytest.mark.parametrize("world_size", [1, 2, THREE, 4])
@pytest.mark.parametrize("scenario", ["data_movement", "rooted_and_scattered"])
def test_other_collectives(scenario, world_size):
    before = shm_entries()
    module = OTHER_COLLECTIVES[scenario]
    result = spawn(f"{module.__name__}:{scenario}", world_size, env=SMALL_CHUNKS)
    assert_job_passes(result, min_cases=getattr(module, f"{scenario}_cases")(world_size))
    assert shm_entries() - before == set()


@pytest.mark.parametrize("world_size", [1, 3])
def test_every_reduction(world_size):
    """Every reduce op with every dtype it accepts (tests.reduction_scenarios), as across nodes."""
    small = int(SMALL_CHUNKS["SHMCOLL_SMALL_BYTES"])
    result = spawn("tests.reduction_scenarios:every_reduction", world_size, env=SMALL_CHUNKS,
                   args=[str(small), "4096"])
    assert_job_passes(result, min_cases=len(reduction_scenarios.planned(world_size, small, 4096)))


@pytest.mark.parametrize("world_size", [1, 3])
def test_every_dtype_moved(world_size):
    result = spawn("tests.movement_scenarios:every_dtype_moved", world_size, env=SMALL_CHUNKS)
    assert_job_passes(result, min_cases=movement_scenarios.every_dtype_moved_cases(world_size))


@pytest.mark.parametrize("world_size", [1, 2, THREE, 4])
def test_api_surface(world_size):
    result = spawn("tests.api_scenarios:api_surface", world_size, env=SMALL_CHUNKS)
    assert_job_passes(result, min_cases=len(api_scenarios.API_CASES))


@pytest.mark.parametrize("world_size", [1, 2, THREE, 4])
@pytest.mark.parametrize("config", ["default", "small_chunks"])
def test_point_to_point(world_size, config):
    env = {**SMALL_CHUNKS, "SHMCOLL_P2P_BYTES": "4096"} if config == "small_chunks" else {}
    result = spawn("tests.p2p_scenarios:point_to_point", world_size, env=env)
    assert_job_passes(result, min_cases=p2p_scenarios.point_to_point_cases(world_size))


@pytest.mark.parametrize("world_size", [1, THREE])
def test_lifecycle(world_size):
    before = shm_entries()
    result = spawn("tests.lifecycle_scenarios:lifecycle", world_size)
    assert_job_passes(result, min_cases=len(lifecycle_scenarios.LIFECYCLE_CASES))
    assert shm_entries() - before == set()


@pytest.mark.parametrize("layout", [[0, 0], [0, 0, 0], [0, 0, 1], [0, 1, 1, 1]], ids=["2", "3", "2+1", "1+3"])
def test_in_place_overlap(layout):
    result = spawn("tests.overlap_scenarios:in_place_overlap", len(layout), env=SMALL_CHUNKS,
                   rank_env=lambda rank: {"SHMCOLL_HOSTID": f"node{layout[rank]}"})
    assert_job_passes(result, min_cases=overlap_scenarios.in_place_overlap_cases())


@pytest.mark.parametrize("world_size", [1, THREE])
def test_fast_paths(world_size):
    result = spawn("tests.fast_path_scenarios:fast_paths", world_size, env=SMALL_CHUNKS)
    assert_job_passes(result, min_cases=fast_path_scenarios.fast_paths_cases())


@pytest.mark.compat
def test_fast_paths_options_by_getters():
    """Where the options' fields are not found in torch's structs, the compiled path reads their getters."""
    result = spawn("tests.fast_path_scenarios:fast_paths", 3, env={**SMALL_CHUNKS, "TEST_OPTIONS_BY_GETTERS": "1"})
    assert_job_passes(result, min_cases=fast_path_scenarios.fast_paths_cases())
