"""Ranks whose settings or arguments differ where Gloo's contract lets them: correct results or a clear error
on every rank, never a wrong result or a hang (tests/agreement.py)."""
import pytest

from shmcoll._env import group_wide, read_settings
from tests.harness import assert_job_passes, spawn

DEFAULTS = group_wide(read_settings({}))  # every group-wide setting's default, by variable


# (variable, value on one rank, that rank): smaller on a rank that attaches, larger on the creator.
@pytest.mark.parametrize("variable,value,odd_rank", [
    ("SHMCOLL_CHUNK_BYTES", 64 * 1024, 1), ("SHMCOLL_CHUNK_BYTES", 1024 * 1024, 0),
    ("SHMCOLL_P2P_BYTES", 4 * 1024, 1), ("SHMCOLL_P2P_BYTES", 256 * 1024, 0),
    ("SHMCOLL_SMALL_BYTES", 1024, 1), ("SHMCOLL_SMALL_BYTES", 512 * 1024, 0),
    ("SHMCOLL_THREAD_BYTES", 16 * 1024, 1), ("SHMCOLL_THREAD_BYTES", 2 * 1024 * 1024, 0),
    ("SHMCOLL_SINGLE_COPY", "0", 1), ("SHMCOLL_SINGLE_COPY", "1", 0),
])
def test_ranks_with_different_settings_use_rank_0s(variable, value, odd_rank):
    # Two threads per rank, so that SHMCOLL_THREAD_BYTES decides how many lanes a collective takes.
    result = spawn("tests.agreement:mixed_settings", 2, env={"SHMCOLL_THREADS": "2"}, timeout=120,
                   rank_env=lambda rank: {variable: str(value)} if rank == odd_rank else {})
    assert_job_passes(result, min_cases=27)
    group_value = value if odd_rank == 0 else DEFAULTS[variable]
    for report in result.reports:
        assert report["settings"] == {**DEFAULTS, variable: group_value}, report["settings"]
    values = [value if rank == odd_rank else DEFAULTS[variable] for rank in range(2)]
    # Rank 0 names the ranks that differ; rank 1, which differs from rank 0 either way, says it does.
    assert f"{variable} differs between the ranks of a new shm group: rank 0 has {values[0]}, rank 1 " \
           f"{values[1]}" in result.outputs[0], result.outputs[0]
    assert f"rank 1: {variable} is {values[1]} here but {values[0]} on rank 0" in result.outputs[1], \
        result.outputs[1]


@pytest.mark.parametrize("single_copy", ["auto", "1"], ids=["default", "single-copy"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_split_size_combinations_match_gloo(world_size, single_copy):
    result = spawn("tests.agreement:split_combinations", world_size, timeout=120,
                   env={"SHMCOLL_CHUNK_BYTES": "4096", "SHMCOLL_SMALL_BYTES": "1024",
                        "SHMCOLL_SINGLE_COPY": single_copy})
    assert_job_passes(result, min_cases=4 * 2 ** world_size + 3 * 2 ** world_size + 3)
