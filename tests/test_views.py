"""Lazily negated and conjugated views, and tensors at a stride of 2, in every collective and send/recv
(tests.view_scenarios), read and written as torch shows them: one rank, one node of 3, and nodes of 2 + 1."""
import pytest

from tests import view_scenarios
from tests.harness import assert_job_passes, spawn
from tests.multinode import SMALL_CHUNKS

NAMES = 13  # the collectives and send/recv of view_scenarios.every_view


def planned(world_size: int) -> int:
    """The cases every rank runs: per view kind, dtype, collective, size (3), sync and async, twice."""
    names = NAMES - (world_size == 1)  # send_recv needs a peer
    per = 3 * 2 * 2
    neg = sum(names - dtype.is_complex for dtype in view_scenarios.NEG_DTYPES)  # no MAX of complex numbers
    conj = len(view_scenarios.CONJ_DTYPES) * (names - 1)
    strided = sum(names - dtype.is_complex for dtype in view_scenarios.STRIDED_DTYPES) * per
    return (neg + conj) * per + strided


# The compatibility tier (TESTING.md, "Every torch") takes the 3 ranks on one node.
@pytest.mark.parametrize("layout", [[0], pytest.param([0, 0, 0], marks=pytest.mark.compat), [0, 0, 1]],
                         ids=["1", "3", "2+1"])
def test_every_view(layout):
    result = spawn("tests.view_scenarios:every_view", len(layout), env=SMALL_CHUNKS, args=["5003"],
                   rank_env=lambda rank: {"SHMCOLL_HOSTID": f"node{layout[rank]}"}, timeout=600)
    assert_job_passes(result, min_cases=planned(len(layout)))
