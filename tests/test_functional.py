"""Functional collectives on shm, eager and compiled, against Gloo (tests.functional_scenarios)."""
import pytest

from tests.harness import assert_job_passes, spawn

SMALL_CHUNKS = {"SHMCOLL_CHUNK_BYTES": "4096", "SHMCOLL_SMALL_BYTES": "1024"}


@pytest.mark.compat
@pytest.mark.parametrize("world_size", [2, 3])
def test_functional_collectives_match_gloo(world_size):
    result = spawn("tests.functional_scenarios:functional", world_size, env=SMALL_CHUNKS, timeout=300)
    assert_job_passes(result, min_cases=5)  # eager and compiled at two sizes, and the compiled front's
