"""Everything shm takes from torch beyond its public API: one list, ``ITEMS``, checked when a process makes its
first shm group.

shm is a Python ProcessGroup subclass that c10d, DDP, FSDP2, DTensor, torch.compile and the profiler must treat as
one of their own, and for that it leans on names torch does not promise to keep. Each is an ``Item``: what shm
takes, which module of shmcoll uses it, and a check that answers for the running torch with

  None                torch has it as shm uses it, or has no use for it (a torch from before the thing existed);
  a sentence          the fallback in use: torch lacks it, shm does without, and the sentence says what is lost.
                      Logged once per process at INFO (on the group's first rank), listed by
                      ``python -m shmcoll info``;
  TorchChangedError   shm cannot work right without it: the first group fails on every rank, naming the torch
                      version and what changed, rather than return a silently wrong result later.

``check`` runs them when the first group of a process is made (``_registration``'s creator calls it before it
builds the group): attribute lookups, one fail-loud backend made and asked to compute, and the options probe that
the group runs anyway (option_fields caches it). Nothing runs per collective, and later groups pay one flag.

One item costs more than a group should pay: the Gloo workers' thread name needs a Gloo group of its own, so
``python -m shmcoll info`` and the tests check it (``at_group=False``). And what torch calls on shm's own objects
(``work._source_rank()`` from ``dist.recv``, ``group._allgather_base``, a Work's future) no check here can see:
the compatibility tier of the tests runs those on the oldest and the newest supported torch (TESTING.md).

Adding an item: a function that checks it (in the module that uses it, where only that module knows how), an
``Item`` in ``ITEMS``, and a case in tests/unit/test_torch_internals.py that breaks it and sees the fallback or
the error.
"""
from __future__ import annotations

import inspect
import threading
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from shmcoll import _logging, _torch_compat, gloo_exit, option_fields, profiling, torch_releases
from shmcoll._logging import log
from shmcoll.errors import TorchChangedError


class Item(NamedTuple):
    takes: str  # what shm takes from torch, as torch names it
    used_by: str  # where in shmcoll
    check: Callable[[str], str | None]  # given the backend's name: None, a fallback's sentence, or raises
    at_group: bool = True  # checked when the first group is made (else by `python -m shmcoll info` and the tests)


def _registered_for_cpu(name: str) -> None:
    capability = getattr(dist.Backend, "backend_capability", {}).get(name)
    if capability != ["cpu"]:
        raise TorchChangedError(f"Backend.register_backend({name!r}, ..., devices=['cpu']) registered it for "
                                f"{capability}, not for cpu alone")


def _group_method(method: str) -> Callable[[str], None]:
    def check(name: str) -> None:
        if not hasattr(dist.ProcessGroup, method):
            raise TorchChangedError(f"ProcessGroup has no {method}")
        if not hasattr(dist.ProcessGroup.BackendType, "CUSTOM"):
            raise TorchChangedError("ProcessGroup.BackendType has no CUSTOM")

    return check


def _fail_loud_backend(name: str) -> None:
    try:
        backend = _torch_compat.fail_loud_backend(0, 1)
    except (AttributeError, TypeError, RuntimeError) as error:
        raise TorchChangedError(f"FakeProcessGroup with Options.error_on_collective cannot be made: {error}") from None
    try:
        backend.allreduce([torch.zeros(1)]).wait()
    except RuntimeError:
        return None
    raise TorchChangedError("FakeProcessGroup with Options.error_on_collective computed an all_reduce instead of "
                            "raising: a collective shm does not define would silently compute nothing")


def _premul_factor(name: str) -> str | None:
    if hasattr(dist.ReduceOp, "factor"):
        return None
    if "__getstate__" in vars(dist.ReduceOp):  # its own pickle state, (RedOpType.PREMUL_SUM, factor)
        return "a PREMUL_SUM's factor is read from the op's pickle state (ReduceOp has no factor; nothing is lost)"
    raise TorchChangedError("ReduceOp has neither factor nor __getstate__: a PREMUL_SUM's factor cannot be read")


def _options_layout(name: str) -> str | None:
    unread = option_fields.unread()
    if not unread:
        return None
    return (f"the compiled small collectives read {', '.join(unread)} through their getters (0.1-0.4 us more per "
            f"call): the probe did not find them in the options' C++ structs")


def _profiler_events(name: str) -> str | None:
    if profiling.unavailable is None:
        return None
    return f"torch's profiler shows no shm:<collective> events ({profiling.unavailable})"


def _dynamo_skip(name: str) -> str | None:
    if _torch_compat.dynamo_switch() is not None:
        return None
    return ("shm's methods are kept out of TorchDynamo by torch.compiler.disable, which imports torch._dynamo "
            "(about a second) when the first group is made")


def _flight_recorder_skips(name: str) -> str | None:
    # shm's collectives never pass through c10d's dispatcher kernels, where torch 2.15's FlightRecorderHook
    # records, so a hook on shm's group would record nothing: shm is one of the backends the recorder skips,
    # put in the set as torch's own registrars put theirs (before the group's creator returns, which is
    # when torch attaches its hook).
    skipped = getattr(distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(skipped, set):
        skipped.add(name)
        return None
    if hasattr(distributed_c10d, "_maybe_attach_flight_recorder"):
        return ("torch's flight recorder attaches its hook to shm's groups, where it records nothing "
                "(torch has no _FR_SELF_RECORDING_BACKENDS to leave them out)")
    return None  # a torch before 2.15 attaches no flight recorder to a group from Python


# The wrappers that wait for a synchronous Work and drop it; work.ProgressEngine.completed hands them the shared
# Work when its caller's frame runs in _torch_compat.COLLECTIVE_WRAPPERS.
_WAITING_WRAPPERS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                     "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather",
                     "scatter", "barrier")


def _module_globals_of(function_name: str):
    """The globals of the module that defines ``torch.distributed.<function_name>`` beneath its decorators (torch
    wraps its collectives in loggers defined elsewhere); None where torch.distributed has no such function."""
    function = getattr(dist, function_name, None)
    if function is None:
        return None
    return getattr(inspect.unwrap(function), "__globals__", None)


def _shared_work(name: str) -> str | None:
    # A wrapper defined elsewhere is only slower (its calls each get a Work of their own), never wrong: a Work is
    # shared only with frames whose globals are COLLECTIVE_WRAPPERS.
    moved = [wrapper for wrapper in _WAITING_WRAPPERS
             if _module_globals_of(wrapper) is not _torch_compat.COLLECTIVE_WRAPPERS]
    if not moved:
        return None
    return (f"synchronous calls through torch.distributed.{', '.join(moved)} each get a Work of their own (about a "
            f"microsecond more per call): those wrappers are not in torch.distributed.distributed_c10d")


def _gloo_worker_name(name: str) -> str | None:
    found = gloo_exit.workers_carry_the_name()
    if found is None:
        return None
    return (f"exit does not wait for Gloo's workers, so a job with Gloo groups beside shm's may abort at exit "
            f"(torch issue #190489): {found}")


ITEMS = (
    Item("Backend.register_backend(name, creator, devices=['cpu'])", "_registration", _registered_for_cpu),
    Item("ProcessGroup._register_backend, BackendType.CUSTOM", "process_group", _group_method("_register_backend")),
    Item("ProcessGroup._set_default_backend", "process_group", _group_method("_set_default_backend")),
    Item("FakeProcessGroup._create_internal, FakeProcessGroup.Options.error_on_collective",
         "_torch_compat.fail_loud_backend", _fail_loud_backend),
    Item("ReduceOp.factor (else the op's pickle state)", "_torch_compat.premul_factor", _premul_factor),
    Item("the options' C++ structs behind pybind11 (op, root, asyncOp)", "option_fields", _options_layout),
    Item("torch._C._profiler._RecordFunctionFast, torch._C._autograd._profiler_enabled", "profiling",
         _profiler_events),
    Item("torch._C._dynamo.eval_frame.set_code_exec_strategy, _FrameAction, _FrameExecStrategy",
         "_torch_compat.skip_dynamo", _dynamo_skip),
    Item("distributed_c10d._FR_SELF_RECORDING_BACKENDS (the flight recorder's skip list)", "torch_internals",
         _flight_recorder_skips),
    Item("torch.distributed's collective wrappers, defined in distributed_c10d (they get a shared Work)",
         "work.ProgressEngine.completed", _shared_work),
    Item("Gloo's worker thread name, pt_gloo_runloop", "gloo_exit", _gloo_worker_name, at_group=False),
)

_checked = False
_lock = threading.Lock()


def results(name: str, every: bool = False) -> list[tuple[Item, str | TorchChangedError | None]]:
    """Each item checked for the backend ``name`` (``every``: also those not checked at group creation) with its
    answer: None, a fallback's sentence, or the TorchChangedError that names this torch and what changed."""
    answers = []
    for item in ITEMS:
        if not (item.at_group or every):
            continue
        try:
            answers.append((item, item.check(name)))
        except TorchChangedError as error:
            answers.append((item, TorchChangedError(
                f"shmcoll cannot use torch {torch.__version__}: {error} (shmcoll's {item.used_by} takes "
                f"{item.takes} from torch; tested on torch {', '.join(torch_releases.RELEASES)})")))
    return answers


def check(name: str, rank: int) -> None:
    """At the first group of a process (``rank`` its rank there): the warning of a torch newer than tested, then
    every item; each fallback logged at INFO on rank 0, the first item without one raised. Once per process."""
    global _checked
    with _lock:
        if _checked:
            return
        _logging.configure(rank)  # SHMCOLL_LOG_LEVEL applies to what follows, as to the group's own lines
        _torch_compat.warn_if_untested()
        answers = results(name)
        for item, answer in answers:
            if isinstance(answer, TorchChangedError):
                raise answer
        if rank == 0:
            for item, answer in answers:
                if answer is not None:
                    log.info("shmcoll: torch %s: %s: %s", torch.__version__, item.takes, answer)
        _checked = True
