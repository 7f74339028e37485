"""The "shmcoll" logger: INFO summary on the group's first rank, DEBUG per collective,
warnings naming the ranks a long wait is for, and the variables that turn it up."""
import logging

import pytest

from shmcoll import _logging
from tests.harness import assert_job_passes, spawn

SUMMARY = "shm process group of 2 ranks on 1 node(s)"


def test_info_summary_on_first_rank_only():
    result = spawn("tests.logging_scenarios:collectives", 2, env={"SHMCOLL_LOG_LEVEL": "INFO"}, timeout=90)
    assert_job_passes(result, min_cases=1)
    # Two ranks with one thread each: one-shot in one step up to a slot (512 KiB by default), in steps above.
    assert SUMMARY in result.outputs[0], result.outputs[0]
    assert "one-shot up to 524288 B, one-shot steps of a chunk above" in result.outputs[0], result.outputs[0]
    assert SUMMARY not in result.outputs[1], result.outputs[1]
    assert "all_reduce(sum" not in result.outputs[0]  # per-collective lines are DEBUG


def test_torch_detail_logs_every_collective():
    result = spawn("tests.logging_scenarios:collectives", 2, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
                   timeout=90)
    assert_job_passes(result, min_cases=1)
    for rank, output in enumerate(result.outputs):
        assert f"rank {rank}: all_reduce(sum, float32, 3 elements) #1" in output, output
        assert f"rank {rank}: broadcast(" in output and "#2" in output, output
        assert f"rank {rank}: all_reduce(sum, float32, 2 elements) #3" in output, output


def test_quiet_by_default():
    result = spawn("tests.logging_scenarios:collectives", 2, timeout=90)
    assert_job_passes(result, min_cases=1)
    assert not any("shmcoll" in output for output in result.outputs), result.outputs


def test_long_waits_name_the_late_rank():
    """Warnings (shown without any logging set-up) after a third of a 6 s timeout."""
    result = spawn("tests.logging_scenarios:late_peer", 2, timeout=90)
    assert_job_passes(result, min_cases=[2, 1])  # rank 0 also receives
    waiting = result.outputs[0]
    assert "rank 0 has waited 2 s in all_reduce(sum, float32, 3 elements)" in waiting, waiting
    assert "for rank(s) 1 (alive, not there yet)" in waiting, waiting
    # Point-to-point waits warn through the same funnel (shmcoll.waits), in the same words.
    assert "rank 0 has waited 2 s in receive of 16 bytes (tag 0) from rank 1 for rank(s) 1" in waiting, waiting
    assert "has waited" not in result.outputs[1], result.outputs[1]


@pytest.mark.parametrize("environ, level", [
    ({}, None),
    ({"SHMCOLL_LOG_LEVEL": "debug"}, logging.DEBUG),
    ({"TORCH_DISTRIBUTED_DEBUG": "INFO"}, logging.INFO),
    ({"TORCH_DISTRIBUTED_DEBUG": "OFF"}, None),
    ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "SHMCOLL_LOG_LEVEL": "WARNING"}, logging.DEBUG),
])
def test_requested_level(environ, level):
    assert _logging.requested_level(environ) == level


def test_bad_level_names_the_variable():
    with pytest.raises(ValueError, match="SHMCOLL_LOG_LEVEL='LOUD'"):
        _logging.requested_level({"SHMCOLL_LOG_LEVEL": "loud"})
