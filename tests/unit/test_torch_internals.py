"""What shm takes from torch's internals (shmcoll.torch_internals): on this torch every item is as shm takes it;
each item, broken as a new torch could break it, answers with its fallback or with an error that names the torch
and what changed; the first group of a process runs them once, logs each fallback once, and fails on an error."""
import logging
import re

import pytest
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch._C._dynamo import eval_frame
from torch.distributed import distributed_c10d

from shmcoll import _torch_compat, gloo_exit, option_fields, profiling, torch_internals
from shmcoll.errors import TorchChangedError

# The compatibility tier (TESTING.md, "Every torch"): this whole file runs on every supported torch in CI.
pytestmark = pytest.mark.compat

NAME = "shm"


def _answer(takes: str):
    """The answer of the one item whose ``takes`` contains ``takes``."""
    (found,) = [answer for item, answer in torch_internals.results(NAME, every=True) if takes in item.takes]
    return found


def _changed(takes: str, *expected: str) -> None:
    answer = _answer(takes)
    assert isinstance(answer, TorchChangedError), answer
    for text in (f"torch {torch.__version__}", *expected):
        assert text in str(answer), (text, str(answer))


def _fallback(takes: str, *expected: str) -> None:
    answer = _answer(takes)
    assert isinstance(answer, str), answer
    for text in expected:
        assert text in answer, (text, answer)


def test_every_item_is_as_shm_takes_it_on_this_torch():
    """None everywhere, on every supported torch: but torch 2.12 has no ReduceOp.factor (its fallback)."""
    expected = set() if hasattr(dist.ReduceOp, "factor") else {"ReduceOp.factor (else the op's pickle state)"}
    answers = torch_internals.results(NAME, every=True)
    assert {item.takes for item, answer in answers if answer is not None} == expected, answers
    assert len(answers) == len(torch_internals.ITEMS)


def test_registered_for_other_devices(monkeypatch):
    monkeypatch.setitem(dist.Backend.backend_capability, NAME, ["cpu", "cuda"])
    _changed("Backend.register_backend(", "['cpu', 'cuda'], not for cpu alone")


@pytest.mark.parametrize("method", ["_register_backend", "_set_default_backend"])
def test_group_without_a_method(monkeypatch, method):
    monkeypatch.delattr(dist.ProcessGroup, method)
    _changed(f"ProcessGroup.{method}", f"ProcessGroup has no {method}", "process_group")


def test_fail_loud_backend_that_cannot_be_made(monkeypatch):
    monkeypatch.delattr(c10d.FakeProcessGroup, "_create_internal")
    _changed("FakeProcessGroup", "cannot be made", "_create_internal")


def test_fail_loud_backend_that_computes(monkeypatch):
    """A FakeProcessGroup that ignores error_on_collective would answer a collective shm does not define with
    nothing computed: an error, not a fallback."""
    monkeypatch.setattr(_torch_compat, "fail_loud_backend",
                        lambda rank, size: c10d.FakeProcessGroup._create_internal(rank, size, c10d.FakeProcessGroup.Options()))
    _changed("FakeProcessGroup", "computed an all_reduce instead of raising")


def test_premul_factor_without_factor_reads_the_pickle_state(monkeypatch):
    op = dist._make_nccl_premul_sum(2.5)
    monkeypatch.delattr(dist.ReduceOp, "factor", raising=False)
    _fallback("ReduceOp.factor", "pickle state")
    assert _torch_compat.premul_factor(op) == 2.5


def test_premul_factor_without_either(monkeypatch):
    monkeypatch.delattr(dist.ReduceOp, "factor", raising=False)
    monkeypatch.delattr(dist.ReduceOp, "__getstate__")
    _changed("ReduceOp.factor", "neither factor nor __getstate__")


def test_options_not_found_are_read_by_getters(monkeypatch):
    found = option_fields.offsets
    monkeypatch.setattr(option_fields, "offsets", lambda options_type: {name: -1 for name in found(options_type)})
    _fallback("options' C++ structs", "AllreduceOptions.reduceOp", "BroadcastOptions.rootRank", "getters")


@pytest.mark.parametrize("module, name", [(torch._C._profiler, "_RecordFunctionFast"),
                                          (torch._C._autograd, "_profiler_enabled")])
def test_profiler_without_its_fast_event(monkeypatch, module, name):
    """The probe turns events off (never active) where torch lacks what it records them with."""
    monkeypatch.delattr(module, name)
    enabled, event, unavailable = profiling._probe()
    assert event is None and not enabled() and name in unavailable, unavailable
    monkeypatch.setattr(profiling, "unavailable", unavailable)
    _fallback("_RecordFunctionFast", "no shm:<collective> events", name)


def test_profiler_event_of_another_signature(monkeypatch):
    def takes_a_name_only(name):
        return None

    monkeypatch.setattr(torch._C._profiler, "_RecordFunctionFast", takes_a_name_only)
    enabled, event, unavailable = profiling._probe()
    assert event is None and not enabled() and unavailable.startswith("TypeError"), unavailable


def test_dynamo_without_the_code_switch(monkeypatch):
    monkeypatch.delattr(eval_frame, "set_code_exec_strategy")
    assert _torch_compat.dynamo_switch() is None
    _fallback("set_code_exec_strategy", "torch.compiler.disable")


@pytest.mark.skipif(not hasattr(distributed_c10d, "_maybe_attach_flight_recorder"),
                    reason="this torch attaches no flight recorder to a group from Python (before 2.15)")
def test_flight_recorder_skips_shm(monkeypatch):
    skipped = distributed_c10d._FR_SELF_RECORDING_BACKENDS
    monkeypatch.setattr(distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", skipped - {NAME})
    assert _answer("_FR_SELF_RECORDING_BACKENDS") is None
    assert NAME in distributed_c10d._FR_SELF_RECORDING_BACKENDS
    monkeypatch.delattr(distributed_c10d, "_FR_SELF_RECORDING_BACKENDS")
    _fallback("_FR_SELF_RECORDING_BACKENDS", "records nothing")


def test_gloo_workers_of_another_name(monkeypatch):
    monkeypatch.setattr(gloo_exit, "_GLOO_WORKER", "pt_gloo_renamed")
    _fallback("pt_gloo_runloop", "exit does not wait", "pt_gloo_runloop")


@pytest.fixture
def first_group(monkeypatch):
    """As if this process had made no group yet."""
    monkeypatch.setattr(torch_internals, "_checked", False)


def test_the_first_group_fails_naming_what_changed_and_so_does_the_next(monkeypatch, first_group):
    monkeypatch.delattr(dist.ProcessGroup, "_set_default_backend")
    for _ in range(2):
        with pytest.raises(TorchChangedError, match=re.escape(f"torch {torch.__version__}: ProcessGroup has no _set_")):
            torch_internals.check(NAME, 0)


@pytest.mark.parametrize("rank, lines", [(0, 1), (1, 0)])
def test_a_fallback_is_logged_once_on_the_first_rank(monkeypatch, caplog, first_group, rank, lines):
    monkeypatch.delattr(eval_frame, "set_code_exec_strategy")
    with caplog.at_level(logging.INFO, logger="shmcoll"):
        for _ in range(3):  # three groups in one process
            torch_internals.check(NAME, rank)
    said = [r.getMessage() for r in caplog.records if r.name == "shmcoll" and r.levelno == logging.INFO]
    # one line per fallback in use: this one, and any this torch has anyway (torch 2.12: ReduceOp.factor's)
    assert len([line for line in said if "torch.compiler.disable" in line]) == lines, said
    assert len(said) == len(set(said)) and (rank == 0 or not said), said


def test_collective_wrappers_moved_out_of_distributed_c10d(monkeypatch):
    """A wrapper torch defines elsewhere gets no shared Work: said as the fallback, naming the wrapper."""
    original = dist.all_reduce

    def all_reduce(*args, **kwargs):  # this module's globals, as a wrapper moved to another module would have
        return original(*args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    _fallback("collective wrappers", "torch.distributed.all_reduce each get a Work of their own")
    monkeypatch.setattr(dist, "all_reduce", original)
    assert _answer("collective wrappers") is None
