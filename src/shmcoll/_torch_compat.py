"""What differs between the torch versions shmcoll supports, decided once, here.

Every other module asks this one instead of testing versions itself:

  premul_factor    ``ReduceOp.factor`` (how a PREMUL_SUM carries its factor) exists
                   from torch 2.13; torch 2.11 and 2.12 only give it through the op's
                   pickle state, ``(RedOpType.PREMUL_SUM, factor)``.
  skip_dynamo      keeps a function and everything it calls out of TorchDynamo.
  untested         a torch newer than the newest release the test suite has passed on
                   (``torch_releases``) is used all the same, with one warning per process.

Probed by capability, not by version number, so a backport or a nightly behaves
as what it can do. The version number only decides that warning. Each of torch's
internals these lean on is an item of ``torch_internals``, checked when the first
group of a process is made.
"""
from __future__ import annotations

import threading

import torch
from torch._C import _distributed_c10d as c10d
from torch.distributed import distributed_c10d

from shmcoll import torch_releases
from shmcoll._logging import log

__all__ = ["AllgatherOptions", "COLLECTIVE_WRAPPERS", "dynamo_switch", "premul_factor", "skip_dynamo",
           "fail_loud_backend", "untested", "warn_if_untested"]

_warned = threading.Lock()  # held for good once the warning is out: once per process, whichever thread

# Not re-exported by torch.distributed in every version.
AllgatherOptions = c10d.AllgatherOptions

# The globals of torch's collective wrappers (``dist.all_reduce`` and the rest), which wait for a synchronous
# Work and drop it, never asking it for more: such a call may get a Work shared by all of them
# (``shmcoll.work.ProgressEngine.completed``). Were the wrappers to move, every call would get a Work of its own:
# slower, never wrong.
COLLECTIVE_WRAPPERS = vars(distributed_c10d)


def premul_factor(redop) -> float:
    """The factor of a PREMUL_SUM ReduceOp (a scalar or a one-element tensor)."""
    if hasattr(redop, "factor"):
        factor = redop.factor
    else:
        kind, factor = redop.__getstate__()
    return float(factor.item() if isinstance(factor, torch.Tensor) else factor)


def dynamo_switch():
    """Dynamo's per-code-object switch, if this torch has it: (set_strategy, strategy) or None.

    Setting (SKIP, SKIP) on a function's code object makes Dynamo run that frame,
    and every frame it calls, as plain Python. It is set once per function, costs
    nothing per call and, unlike ``torch.compiler.disable``, does not import
    ``torch._dynamo`` (about a second) in processes that never compile.
    """
    try:
        from torch._C._dynamo import eval_frame

        action = eval_frame._FrameAction
        return eval_frame.set_code_exec_strategy, eval_frame._FrameExecStrategy(action.SKIP, action.SKIP)
    except (ImportError, AttributeError):
        return None


def skip_dynamo(cls) -> None:
    """Keep every method ``cls`` defines out of TorchDynamo (see ``dynamo_switch``).

    When a compiled function calls ``dist.all_reduce``, Dynamo graph-breaks in
    torch's wrapper and then tries to compile the frame of our Python method,
    stopping at the first member it may not read (``UnsafeScriptObjectError``).
    Gloo's methods are C++, so nothing is traced there; ours must not be either.
    """
    switch = dynamo_switch()
    for name, member in list(vars(cls).items()):
        function = getattr(member, "__func__", member)
        code = getattr(function, "__code__", None)
        if code is None:
            continue
        if switch is not None:
            switch[0](code, switch[1])
        else:  # this torch lacks the switch: the public, slower way
            setattr(cls, name, torch.compiler.disable(function, recursive=True))


def fail_loud_backend(rank: int, size: int):
    """A C++ Backend that raises on any collective: registered for cpu under the Python group.

    torch (FSDP2's state-dict broadcast, ``dcp.async_save``, DeviceMesh, batched
    p2p) looks beneath a group for its cpu backend; a Python ProcessGroup has
    none unless one is registered. Every collective reaches our Python methods
    first, so this backend only answers the questions asked of a backend (device
    types, coalescing support); a method we do not define falls through to it and
    raises, rather than silently computing nothing.
    """
    options = c10d.FakeProcessGroup.Options()
    options.error_on_collective = True
    return c10d.FakeProcessGroup._create_internal(rank, size, options)



def untested(version: str | None = None) -> str | None:
    """Why torch ``version`` (default: this one) is untested, or None: newer than the newest tested release.

    Compared by (major, minor), so a patch release or a nightly of a tested minor version counts as tested.
    """
    version = torch.__version__ if version is None else str(version)
    found = torch_releases.minor(version)
    if found is None or found <= torch_releases.NEWEST_TESTED:
        return None
    newest = ".".join(map(str, torch_releases.NEWEST_TESTED))
    release = version.split("+")[0]
    return (f"torch {version} is newer than the newest torch shmcoll was tested on ({newest}); the shm "
            f"backend should work, but if it misbehaves, please report it with the output of "
            f"`python -m shmcoll info`. To check this torch, run shmcoll's test suite on it: "
            f"`bash tests/matrix.sh {release}` in a clone of shmcoll (TESTING.md, 'A new torch')")


def warn_if_untested() -> None:
    """Log ``untested()`` as a WARNING, once per process (the first group created calls it)."""
    reason = untested()
    if reason is not None and _warned.acquire(blocking=False):
        log.warning("shmcoll: %s", reason)
