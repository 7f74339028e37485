# cython: language_level=3
"""Whose code called shmcoll (``callers.pxi``), for the Python layers: ``shmcoll.work.ProgressEngine.completed``."""

include "callers.pxi"


def caller_is(module_globals) -> bool:
    """``called_from`` for Python callers (``shmcoll.work``): measured from the caller's frame."""
    return called_from(module_globals)
