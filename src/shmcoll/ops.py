"""The dtype and reduce-op tables in torch's terms, and the reduction plan of each (op, dtype).

The tables themselves are ``kernel_abi``'s (torch-free): this module adds each dtype's
torch dtype by name and each op's ``ReduceOp``. Half-precision tensors travel as raw
16-bit patterns (NumPy has no bfloat16); the kernels know which format the bits are in.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch.distributed import ReduceOp

from shmcoll import _torch_compat, kernel_abi


# The dtypes the kernels reduce, and every dtype a descriptor names (kernel_abi.DTYPE_TABLE, by name).
DTYPES: dict[torch.dtype, kernel_abi.DType] = {
    getattr(torch, d.name): d for d in kernel_abi.DTYPE_TABLE if d.family is not None}
_MOVEMENT_CODES = {getattr(torch, d.name): d.code for d in kernel_abi.DTYPE_TABLE if hasattr(torch, d.name)}
# the floats narrower than float32: the kernels compute them in float32 and round once
_NARROW_FLOATS = frozenset(t for t, d in DTYPES.items() if d.nature == kernel_abi.FLOAT and d.numpy.itemsize < 4)


def movement_code(dtype: torch.dtype) -> int:
    """Descriptor dtype code of a data-movement collective; 0 (count in bytes) if the dtype has none."""
    return _MOVEMENT_CODES.get(dtype, 0)


def movement(tensor: torch.Tensor) -> tuple[int, int]:
    """(count, dtype code) of a data-movement descriptor of ``tensor``: elements of a named dtype, else bytes."""
    code = movement_code(tensor.dtype)
    return (tensor.numel(), code) if code else (tensor.nbytes, 0)


class Op(NamedTuple):
    name: str
    kernel: int  # shmcoll.kernel_abi op code
    average: bool  # the kernel divides the sum by its ``scale`` argument (the rank count)
    code: int  # descriptor op code: kernel + 1 (0: no op)


def _kind(spec: kernel_abi.OpSpec):
    """The ``RedOpType`` of a row of kernel_abi.REDUCE_OPS (by name)."""
    return getattr(ReduceOp.RedOpType, spec.name.upper())


_OPS = {_kind(o): Op(o.name, o.kernel, o.average, o.kernel + 1) for o in kernel_abi.REDUCE_OPS}
# complex tensors are reduced as their real view: the linear ops only
_COMPLEX_KINDS = frozenset([_kind(o) for o in kernel_abi.REDUCE_OPS if o.complex] + [ReduceOp.RedOpType.PREMUL_SUM])


def kind_of(redop):
    """The ``RedOpType`` of ``redop``: a ReduceOp, or a RedOpType itself (as default c10d options carry)."""
    # Not isinstance(redop, ReduceOp): torch makes that true of a RedOpType too.
    return redop if isinstance(redop, ReduceOp.RedOpType) else redop.op


def reduce_op(kind, dtype: torch.dtype) -> tuple[Op, kernel_abi.DType]:
    """Resolve (RedOpType, dtype) to kernel terms, or raise a clear error.

    PREMUL_SUM(factor) resolves to SUM (``Reduction.scale`` carries the factor);
    AVG of integers resolves to SUM (``Reduction.int_average`` divides after).
    """
    op = _OPS.get(kind)
    if op is None and kind != ReduceOp.RedOpType.PREMUL_SUM:
        raise ValueError(f"shm backend does not support reduce op {kind}")
    dt = DTYPES.get(dtype)
    if dt is None:
        raise TypeError(f"shm backend cannot reduce tensors of dtype {dtype}; "
                        f"supported: {', '.join(str(t) for t in DTYPES)}")
    if op is None:
        # NCCL's rule: a factor scales floating-point values only (it would be rounded to 0 or 1 for
        # an integer or bool, and the kernels would not apply it at all).
        if dt.nature != kernel_abi.FLOAT:
            raise ValueError(f"reduce op PREMUL_SUM is not defined for {dtype} tensors (only floating-point "
                             f"and complex ones)")
        op = _OPS[ReduceOp.RedOpType.SUM]
    # AVG of integer tensors has NCCL's meaning (Lightning's sync_dist relies on it): the
    # sum, in the tensor's dtype, divided by the group size and rounded toward zero.
    if op.average and dt.nature == kernel_abi.INTEGER:
        return _OPS[ReduceOp.RedOpType.SUM], dt
    if not kernel_abi.supports(dt.name, op.kernel):
        raise ValueError(f"reduce op {op.name.upper()} is not defined for {dtype} tensors")
    return op, dt


class Reduction(NamedTuple):
    """How one reduction runs: kernel terms and what surrounds the kernel call."""

    op: Op  # what the kernels and rails apply (SUM for PREMUL_SUM and for integer AVG)
    dtype: kernel_abi.DType
    kernel: int  # address of the dtype's C entry point (shmcoll.kernel_abi)
    scale: float  # the kernel's scale: the group size for AVG, the factor for PREMUL_SUM, else 1.0
    as_real: bool  # a complex tensor, reduced as its real view
    premul: bool  # the factor is read from each call's ReduceOp
    int_average: bool  # integer AVG: divide the sum by the group size afterwards, toward zero
    size: int  # ranks in the group
    code: int  # the op the caller asked for, as descriptors name it (so SUM and integer AVG differ)

    @property
    def fixed(self) -> bool:
        """Every call of this (op, dtype) runs alike: no factor read from the call (PREMUL_SUM), no real view
        (complex), nothing after (integer AVG): the plans the fast paths of ``shmcoll.collectives`` keep."""
        return not (self.premul or self.as_real or self.int_average)

    def view(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor the kernels reduce: ``tensor``, or its real view if it is complex."""
        return torch.view_as_real(tensor) if self.as_real else tensor

    def finish(self, tensor: torch.Tensor) -> None:
        """What follows the collective on a rank that holds a result."""
        if self.int_average:
            tensor.div_(self.size, rounding_mode="trunc")

    @property
    def across(self) -> tuple[int, float]:
        """(kernel op, scale) of the partial reductions of a plan across nodes: AVG is a SUM there,
        divided by the group size at the end (``average``); PREMUL_SUM's factor is linear, so it
        applies to the first partials (those of each node), and later ones use 1.0."""
        return (kernel_abi.SUM, 1.0) if self.op.average else (self.op.kernel, self.scale)

    def average(self, tensor: torch.Tensor) -> None:
        """An AVG's sum over the group -> its mean, rounded once (as Gloo and the arena kernels do);
        nothing for other ops."""
        if not self.op.average:
            return
        if tensor.dtype in _NARROW_FLOATS:
            tensor.copy_(tensor.float().div_(self.size))
        else:
            tensor.div_(self.size)

    def local(self, tensor: torch.Tensor) -> None:
        """The reduction over one rank, in place: only PREMUL_SUM's factor changes anything."""
        if self.scale != 1.0 and not self.op.average:
            tensor.mul_(self.scale)


class Reductions:
    """The Reduction of each (op, dtype) a group meets, planned once and reused."""

    def __init__(self, size: int):
        self._size = size
        self._plans: dict = {}

    def plan(self, redop, dtype: torch.dtype, what: str) -> Reduction:
        kind = kind_of(redop)
        plan = self._plans.get((kind, dtype))
        if plan is None:
            plan = self._plans[(kind, dtype)] = self._plan(kind, dtype, what)
        if plan.premul:  # a flag: comparing pybind enums costs half a microsecond
            return plan._replace(scale=_torch_compat.premul_factor(redop))
        return plan

    def _plan(self, kind, dtype: torch.dtype, what: str) -> Reduction:
        from shmcoll import kernel_library  # loads the kernels: not at import

        as_real = dtype.is_complex
        if as_real:
            if kind not in _COMPLEX_KINDS:
                raise ValueError(f"{what}: {kind} is not defined for complex tensors (only SUM, AVG, PREMUL_SUM)")
            dtype = torch.view_as_real(torch.empty(0, dtype=dtype)).dtype
        try:
            op, dt = reduce_op(kind, dtype)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{what}: {error}") from None
        kernel = kernel_library.entry_point(dt.name)  # called by address from shmcoll._schedules
        int_average = kind == ReduceOp.RedOpType.AVG and not op.average
        code = _OPS[kind].code if kind in _OPS else op.code
        return Reduction(op, dt, kernel, float(self._size) if op.average else 1.0, as_real,
                         kind == ReduceOp.RedOpType.PREMUL_SUM, int_average, self._size, code)
