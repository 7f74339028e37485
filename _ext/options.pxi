# c10d's options objects read in C: where a collective's options (op, asyncOp, root) lie in torch's C++ struct.
# Textually included by front.pyx, before front.pxi, its one reader.
#
# ``dist.all_reduce`` makes a fresh ``AllreduceOptions`` per call, and reading it through its pybind getters
# costs more than the rest of shm's 8-byte all-reduce on one core (the reduceOp getter wraps a ReduceOp with
# a keep-alive on its parent; measured: docs/benchmark-log.md, "Where the time goes"). Each field is one load
# in the struct c10d declares (torch/csrc/distributed/c10d/Types.hpp). No header says where, and building against torch's
# would tie the extension to one torch build, so the offsets are found at run time: each field is set through
# its own setter to values known apart, and the one offset that reads them all back is the field's. A field
# not found so (another layout, another binding) is read through its getter as before: slower, never wrong.

from cpython.object cimport PyObject
from libc.stdint cimport uint8_t


cdef inline const char *_options_value(object opts) noexcept:
    """The C++ struct behind an object of a pybind11 class of simple layout (one C++ type per object, as every
    c10d options class has): pybind11's ``instance::simple_value_holder[0]``, the first word after the object's
    header. ``shmcoll.option_fields`` probes only such classes, and front.pxi reads only objects of exactly
    the class probed."""
    return (<const char **>(<char *><PyObject *>opts + sizeof(PyObject)))[0]


cdef inline int64_t _field(const char *value, Py_ssize_t at, Py_ssize_t width) noexcept:
    """The integer of ``width`` bytes (1: unsigned, 8: signed) at byte ``at`` of ``value``."""
    cdef int64_t word
    if width == 1:
        return (<const uint8_t *>value)[at]
    memcpy(&word, value + at, 8)
    return word


def field_offset(options_type, str name, list settings, Py_ssize_t width, Py_ssize_t window):
    """Where field ``name`` of ``options_type``'s C++ struct lies: the one offset (a multiple of ``width``, 1 or
    8 bytes, below ``window``, which the struct as declared is at least) whose integer reads back each
    ``(value, integer)`` of ``settings`` once ``value`` is set through the field's setter, on one object reused
    and on objects made afresh; -1 where no offset or more than one does, and where the field reads back
    through its getter other than set (such a field is not one this reader can take)."""
    if width != 1 and width != 8:
        raise ValueError(f"field width {width}: 1 or 8")
    cdef Py_ssize_t slots = window // width, i
    possible = [True] * slots
    reused = options_type()
    for value, integer in settings:
        for opts in (reused, options_type()):
            setattr(opts, name, value)
            if getattr(opts, name) != value:
                return -1
            for i in range(slots):
                if possible[i] and _field(_options_value(opts), i * width, width) != integer:
                    possible[i] = False
    found = [i * width for i in range(slots) if possible[i]]
    return found[0] if len(found) == 1 else -1
