"""torch.profiler sees every shm collective as it sees Gloo's: one event each, named shm:<collective>, with
its input shapes; the same job on Gloo records the same events (tests.profiler_scenarios)."""
import pytest

from tests.harness import assert_job_passes, spawn
from tests.profiler_scenarios import EXPECTED

# The compatibility tier (TESTING.md, "Every torch"): this whole file runs on every supported torch in CI.
pytestmark = pytest.mark.compat


def _events(backend: str) -> list[dict]:
    result = spawn("tests.profiler_scenarios:profiled_job", 2, backend=backend, timeout=120)
    assert_job_passes(result, min_cases=1)
    return result.reports


def test_every_collective_is_one_event_with_its_shapes_as_on_gloo():
    shm, gloo = _events("shm"), _events("gloo")
    for rank in range(2):
        ours, theirs = shm[rank]["events"], gloo[rank]["events"]
        for name, shapes in EXPECTED.items():
            assert ours.get(name, [])[:len(shapes)] == shapes, (rank, name, ours.get(name))
        # DDP's bucket all-reduces (issued while the backward pass runs), and nothing else
        assert len(ours["all_reduce"]) == len(EXPECTED["all_reduce"]) + shm[rank]["buckets"], ours
        # Gloo records the same, but for its reduce_scatters, which it runs as all_reduces: the tensor form as
        # one, the list form as one per rank
        assert {name: len(v) for name, v in theirs.items()} == {
            **{name: len(v) for name, v in ours.items() if name != "reduce_scatter"},
            "all_reduce": len(ours["all_reduce"]) + 1 + 2}, (ours, theirs)
