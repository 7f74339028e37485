"""torch's flight recorder (2.15 and later, on by default) beside shm: init_process_group("shm") works with it on,
set by TORCH_FR_BUFFER_SIZE or off; it attaches no hook to shm's groups (shm is one of the backends it skips:
shmcoll.torch_internals) and a Gloo group beside them records as ever (tests.flight_recorder_scenarios)."""
import pytest
from torch.distributed import distributed_c10d

from tests.harness import assert_job_passes, spawn

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(not hasattr(distributed_c10d, "_maybe_attach_flight_recorder"),
                       reason="this torch attaches no flight recorder to its groups (torch before 2.15)"),
]


@pytest.mark.parametrize("environ, recording", [({}, "1"), ({"TORCH_FR_BUFFER_SIZE": "64"}, "1"),
                                                ({"TORCH_FR_BUFFER_SIZE": "0"}, "0")],
                         ids=["default", "buffer-64", "off"])
def test_recorder_skips_shm_and_records_gloo(environ, recording):
    result = spawn("tests.flight_recorder_scenarios:recorded", 2, env=environ, args=[recording])
    assert_job_passes(result, min_cases=5)
