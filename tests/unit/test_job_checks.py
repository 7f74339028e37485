"""The checks every multi-rank job goes through (tests/harness.py, tests/leaks.py) fail when they should."""
import mmap
import os

import pytest

from shmcoll import _segment
from tests import leaks
from tests.harness import JobResult, assert_job_passes


def _job(cases_per_rank, leaked=()):
    reports = [{"cases": {name: None for name in names}, "leaks": list(leaked) if rank == 0 else []}
               for rank, names in enumerate(cases_per_rank)]
    return JobResult([0] * len(reports), reports, [""] * len(reports))


def test_a_rank_that_skips_cases_fails_the_job():
    assert_job_passes(_job([["a", "b"], ["a", "b"]]), min_cases=2)
    with pytest.raises(AssertionError, match="rank 1 ran other cases than rank 0"):
        assert_job_passes(_job([["a", "b"], ["a"]]), min_cases=1)
    with pytest.raises(AssertionError, match="only 1 cases ran, not 2"):
        assert_job_passes(_job([["a"], ["a"]]), min_cases=2)
    with pytest.raises(AssertionError, match="cases per rank"):
        assert_job_passes(_job([["a", "b"], ["a"]]), min_cases=[2, 2])


def test_a_leak_reported_by_a_rank_fails_the_job():
    with pytest.raises(AssertionError, match="rank 0: map 1000-2000 /dev/shm/#42"):
        assert_job_passes(_job([["a"], ["a"]], leaked=["map 1000-2000 /dev/shm/#42 (deleted)"]), min_cases=1)


def test_an_unnamed_segment_mapped_or_open_is_seen():
    before = leaks.references("/dev/shm")
    segment = _segment.create_unnamed("/dev/shm", 8192)  # what an arena is made of: mapped, its fd open
    try:
        held = leaks.new_references(before, "/dev/shm")
        assert any(line.startswith("map ") for line in held), held
        assert any(line.startswith("fd ") for line in held), held
        segment.release_fd()
        assert [line for line in leaks.new_references(before, "/dev/shm") if line.startswith("fd ")] == []
    finally:
        segment.close()
    assert leaks.new_references(before, "/dev/shm") == []


def test_other_files_in_dev_shm_are_not_ours():
    """torch.compile's workers keep POSIX semaphores there (sem.*): not a segment of ours."""
    before = leaks.references("/dev/shm")
    path = f"/dev/shm/sem.shmcoll-test-{os.getpid()}"
    with open(path, "wb+") as f:
        f.truncate(4096)
        mapping = mmap.mmap(f.fileno(), 4096)
    os.unlink(path)
    try:
        assert leaks.new_references(before, "/dev/shm") == []
    finally:
        mapping.close()
