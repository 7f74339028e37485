"""all_reduce, broadcast, all_gather and barrier on shm at world sizes 1-4."""
import pytest

from tests import movement_scenarios, reduction_scenarios, scenarios
from tests.harness import assert_job_passes, shm_entries, spawn

# A 4 KiB chunk reaches the multi-chunk paths of every collective with small inputs.
SMALL_CHUNKS = {"SHMCOLL_CHUNK_BYTES": "4096", "SHMCOLL_SMALL_BYTES": "1024"}

# The compatibility tier (TESTING.md, "Every torch") takes each scenario at 3 ranks.
THREE = pytest.param(3, marks=pytest.mark.compat)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("config", ["default", "small_chunks"])
def test_all_reduce_matrix(world_size, config):
    before = shm_entries()
    env = SMALL_CHUNKS if config == "small_chunks" else {}
    # 300001 elements exceed the default 512 KiB chunk for every dtype wider than one byte.
    big = "5003" if config == "small_chunks" else "300001"
    result = spawn("tests.scenarios:allreduce_matrix", world_size, env=env, args=[big])
    assert_job_passes(result, min_cases=scenarios.allreduce_matrix_planned(world_size, big))
    assert shm_entries() - before == set()


@pytest.mark.parametrize("world_size", [1, 2, THREE, 4])
@pytest.mark.parametrize("scenario", ["data_movement", "rooted_and_scattered"])
def test_other_collectives(scenario, world_size):
    before = shm_entries()
    result = spawn(f"tests.scenarios:{scenario}", world_size, env=SMALL_CHUNKS)
    assert_job_passes(result, min_cases=getattr(scenarios, f"{scenario}_planned")(world_size))
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
    per_dtype = 3 * (world_size + 2 * len({0, world_size - 1}) + 2)
    assert_job_passes(result, min_cases=per_dtype * len(movement_scenarios.DTYPES))


@pytest.mark.parametrize("world_size", [1, 2, THREE, 4])
def test_api_surface(world_size):
    result = spawn("tests.api_scenarios:api_surface", world_size, env=SMALL_CHUNKS)
    assert_job_passes(result, min_cases=8)


@pytest.mark.parametrize("world_size", [1, 2, THREE, 4])
@pytest.mark.parametrize("config", ["default", "small_chunks"])
def test_point_to_point(world_size, config):
    env = {**SMALL_CHUNKS, "SHMCOLL_P2P_BYTES": "4096"} if config == "small_chunks" else {}
    result = spawn("tests.p2p_scenarios:point_to_point", world_size, env=env)
    assert_job_passes(result, min_cases=1 if world_size == 1 else 25)


@pytest.mark.parametrize("world_size", [1, THREE])
def test_lifecycle(world_size):
    before = shm_entries()
    result = spawn("tests.group_scenarios:lifecycle", world_size)
    assert_job_passes(result, min_cases=5)
    assert shm_entries() - before == set()


@pytest.mark.parametrize("world_size", [2, 3])
def test_in_place_overlap(world_size):
    result = spawn("tests.scenarios:in_place_overlap", world_size, env=SMALL_CHUNKS)
    assert_job_passes(result, min_cases=6)


@pytest.mark.parametrize("world_size", [1, THREE])
def test_fast_paths(world_size):
    result = spawn("tests.fast_path_scenarios:fast_paths", world_size, env=SMALL_CHUNKS)
    assert_job_passes(result, min_cases=30)


@pytest.mark.compat
def test_fast_paths_options_by_getters():
    """Where the options' fields are not found in torch's structs, the compiled path reads their getters."""
    result = spawn("tests.fast_path_scenarios:fast_paths", 3, env={**SMALL_CHUNKS, "TEST_OPTIONS_BY_GETTERS": "1"})
    assert_job_passes(result, min_cases=30)
