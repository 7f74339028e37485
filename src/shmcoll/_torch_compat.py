"""What differs between the torch versions shmcoll supports, decided once, here.

Every other module asks this one instead of testing versions itself:

  premul_factor    ``ReduceOp.factor`` (how a PREMUL_SUM carries its factor) exists
                   from torch 2.13; torch 2.11 and 2.12 only give it through the op's
                   pickle state, ``(RedOpType.PREMUL_SUM, factor)``.
  skip_dynamo      keeps a function and everything it calls out of TorchDynamo.

Probed by capability, not by version number, so a backport or a nightly behaves
as what it can do.
"""
from __future__ import annotations

import torch
from torch._C import _distributed_c10d as c10d

__all__ = ["AllgatherOptions", "premul_factor", "skip_dynamo", "fail_loud_backend"]

# Not re-exported by torch.distributed in every version.
AllgatherOptions = c10d.AllgatherOptions


def premul_factor(redop) -> float:
    """The factor of a PREMUL_SUM ReduceOp (a scalar or a one-element tensor)."""
    if hasattr(redop, "factor"):
        factor = redop.factor
    else:
        kind, factor = redop.__getstate__()
    return float(factor.item() if isinstance(factor, torch.Tensor) else factor)


def _recursive_skip():
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
    """Keep every method ``cls`` defines out of TorchDynamo (see ``_recursive_skip``).

    When a compiled function calls ``dist.all_reduce``, Dynamo graph-breaks in
    torch's wrapper and then tries to compile the frame of our Python method,
    stopping at the first member it may not read (``UnsafeScriptObjectError``).
    Gloo's methods are C++, so nothing is traced there; ours must not be either.
    """
    switch = _recursive_skip()
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

