"""A short soak (the long one: python -m tests.soak --ops 100000) and two threads on two groups."""
from tests.harness import assert_job_passes, shm_entries, spawn
from tests.soak import SOAK_ENV


def test_short_soak_four_ranks():
    before = shm_entries()
    result = spawn("tests.soak:soak", 4, env=SOAK_ENV, args=["1500", "7"])
    assert_job_passes(result, min_cases=2)
    assert all(r["mismatches"] == 0 for r in result.reports)
    assert shm_entries() - before == set()


def test_two_threads_on_two_groups():
    result = spawn("tests.soak:two_threads", 3)
    assert_job_passes(result, min_cases=1)
