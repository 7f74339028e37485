"""Where the compiled small collectives read c10d's options (shmcoll.option_fields), against the getters."""
import ctypes
import datetime
import random

import pytest
import torch.distributed as dist

from shmcoll import _front, option_fields

# The compatibility tier (TESTING.md, "Every torch"): this whole file runs on every supported torch in CI.
pytestmark = pytest.mark.compat

TYPES = list(option_fields._FIELDS)


def _read(opts, at: int, width: int) -> int:
    """The field at byte ``at`` of the C++ struct behind ``opts``, read here as pybind11 lays an instance out
    (the struct's address is the first word after the object's header), independently of the extension."""
    value = ctypes.c_void_p.from_address(id(opts) + object.__basicsize__).value
    return int.from_bytes(ctypes.string_at(value + at, width), "little", signed=width == 8)


@pytest.mark.parametrize("options_type", TYPES, ids=lambda t: t.__name__)
def test_every_field_is_found_on_this_torch(options_type):
    """On the torch we test, every field is read in C (a -1 would fall back to the getter: slower, not wrong)."""
    found = option_fields.offsets(options_type)
    assert found and all(at >= 0 for at in found.values()), found


@pytest.mark.parametrize("options_type", TYPES, ids=lambda t: t.__name__)
def test_each_offset_reads_what_the_getter_reads(options_type):
    ops = [op for op, _ in option_fields._OPS]
    rng = random.Random(7)
    for _ in range(200):
        opts = options_type()
        widths = {name: width for name, width, _ in option_fields._FIELDS[options_type][1]}
        if "reduceOp" in widths:
            opts.reduceOp = rng.choice(ops)
        if "rootRank" in widths:
            opts.rootRank = rng.randrange(-(1 << 40), 1 << 40)
        opts.asyncOp = rng.random() < 0.5
        opts.timeout = datetime.timedelta(milliseconds=rng.randrange(1 << 30))
        for name, at in option_fields.offsets(options_type).items():
            getter = getattr(opts, name)
            want = hash(getter) if name == "reduceOp" else int(getter)
            assert _read(opts, at, widths[name]) == want, (name, at, getter)


def test_a_class_of_another_binding_is_never_probed():
    """Only pybind11's simple layout holds a pointer to the struct after the object's header: any other class
    is read through its getters, whatever its fields (probing it could read through a value as a pointer)."""

    class Plain:  # a Python class with the same fields
        reduceOp = dist.ReduceOp.SUM
        asyncOp = True

    class Derived(dist.AllreduceOptions):  # a Python subclass: not the class torch's wrapper makes
        pass

    option_fields._FIELDS[Plain] = option_fields._FIELDS[Derived] = option_fields._FIELDS[dist.AllreduceOptions]
    try:
        assert option_fields.offsets(Plain) == {"reduceOp": -1, "asyncOp": -1}
        assert option_fields.offsets(Derived) == {"reduceOp": -1, "asyncOp": -1}
    finally:
        del option_fields._FIELDS[Plain], option_fields._FIELDS[Derived]


def test_a_field_is_not_found_where_no_one_offset_reads_it_back():
    flags = option_fields._FLAGS
    at = option_fields.offsets(dist.AllreduceOptions)["asyncOp"]
    # the window ends before the field: nothing reads it
    assert _front.field_offset(dist.AllreduceOptions, "asyncOp", flags, 1, at) == -1
    # values that are not what the field holds
    assert _front.field_offset(dist.AllreduceOptions, "asyncOp", [(v, 1 - i) for v, i in flags], 1, 48) == -1
    # two settings that read the same everywhere leave every stable byte possible: not one offset
    assert _front.field_offset(dist.BroadcastOptions, "rootRank", [(0, 0), (0, 0)], 8, 32) == -1
    with pytest.raises(ValueError, match="width 4"):
        _front.field_offset(dist.BroadcastOptions, "rootRank", [(1, 1)], 4, 32)
