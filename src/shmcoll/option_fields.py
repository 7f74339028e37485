"""Where the compiled small collectives read c10d's options: each field's byte offset in torch's C++ struct.

Reading a fresh options object through its pybind getters is the largest cost left in a small collective
(measured: docs/benchmark-log.md, "Where the time goes", the options read in C); a load at the field's offset
costs nothing. ``_front.field_offset`` finds each offset by setting the field to values known apart
(``_ext/options.pxi`` says how and why); a field it cannot find is read through its getter (-1 below).

The windows are the least each struct can be as torch/csrc/distributed/c10d/Types.hpp declares it (on
every release of ``torch_releases.RELEASES``: ReduceOp is a vtable, a refcount, its op and a supplement
pointer, 32 bytes), so the probe reads nothing outside the struct whatever the layout.
"""
from __future__ import annotations

import functools

import torch.distributed as dist

from shmcoll import _front
from shmcoll._torch_compat import AllgatherOptions

# The op values the probe sets (PREMUL_SUM needs a factor, and no plan of it is ever admitted).
_OPS = [(dist.ReduceOp(kind), kind.value) for kind in dist.ReduceOp.RedOpType.__members__.values()
        if kind != dist.ReduceOp.RedOpType.PREMUL_SUM]
_FLAGS = [(False, 0), (True, 1), (True, 1), (False, 0), (True, 1)]
_ROOTS = [(0, 0), (1, 1), (3, 3), (2, 2), ((1 << 40) + 5, (1 << 40) + 5), (-7, -7)]

# Per options type: its window in bytes, then (field, width, settings) for each field read in C.
_FIELDS = {
    dist.AllreduceOptions: (48, (("reduceOp", 1, _OPS), ("asyncOp", 1, _FLAGS))),
    dist.BroadcastOptions: (32, (("rootRank", 8, _ROOTS), ("asyncOp", 1, _FLAGS))),
    AllgatherOptions: (16, (("asyncOp", 1, _FLAGS),)),
    dist.ReduceScatterOptions: (48, (("reduceOp", 1, _OPS), ("asyncOp", 1, _FLAGS))),
    dist.ReduceOptions: (64, (("reduceOp", 1, _OPS), ("rootRank", 8, _ROOTS), ("asyncOp", 1, _FLAGS))),
    dist.AllToAllOptions: (16, (("asyncOp", 1, _FLAGS),)),
    dist.GatherOptions: (24, (("rootRank", 8, _ROOTS), ("asyncOp", 1, _FLAGS))),
    dist.ScatterOptions: (24, (("rootRank", 8, _ROOTS), ("asyncOp", 1, _FLAGS))),
    dist.BarrierOptions: (40, (("asyncOp", 1, _FLAGS),)),
}


@functools.cache
def offsets(options_type) -> dict[str, int]:
    """Each field of ``options_type`` that the small collectives read, with its byte offset (-1: not found,
    read through the getter). Probed once per process."""
    window, fields = _FIELDS[options_type]
    if not _simple_pybind11(options_type):  # another binding: its object may hold no pointer to read
        return {name: -1 for name, _, _ in fields}
    return {name: _front.field_offset(options_type, name, settings, width, window)
            for name, width, settings in fields}


def _simple_pybind11(options_type) -> bool:
    """Whether ``options_type`` is a pybind11 class with no other base, whose objects keep a pointer to their C++
    value right after the object's header (pybind11's simple layout), the one layout the probe reads."""
    return (type(options_type).__name__ == "pybind11_type" and len(options_type.__mro__) == 3
            and options_type.__mro__[1].__name__ == "pybind11_object")


def unread() -> list[str]:
    """Every field the small collectives read that the probe did not find on this torch ("AllreduceOptions.reduceOp"),
    each read through its getter instead (torch_internals lists them)."""
    return [f"{options_type.__name__}.{name}" for options_type in _FIELDS
            for name, at in offsets(options_type).items() if at < 0]
