"""Whose code called shmcoll (``shmcoll._callers``, the check that decides which synchronous calls may share one
Work): the innermost frame outside the package, found through frames of the package's modules, through C code
between Python frames (torch's pybind11 layer is such C code), and past frames not yet running; never a frame
further out than the first one outside it.

Each case builds the call chain from modules made here, named as the package's (``shmcoll.*``) or not, so the
walk meets exactly the frames the case names."""
import types

import pytest

from shmcoll._callers import caller_is

# The walk reads CPython's own frame records on 3.11-3.13 (its internal header): run on every torch's CI tier.
pytestmark = pytest.mark.compat


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.caller_is = caller_is
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


# The package's layers: a method that asks (as front.pxi and ProgressEngine.completed do), and one below the
# caller that calls into it (as process_group calls backend).
_ASKS = _module("shmcoll.asks", "def ask(target):\n    return caller_is(target)\n")
_LAYER = _module("shmcoll.layer", "def through(ask, target):\n    return ask(target)\n")


def _user(name: str = "user_code"):
    """A module outside the package whose functions call the package's layers in different ways."""
    return _module(name, """
def direct(ask, target):
    return ask(target)

def via(layer, ask, target):
    return layer(ask, target)

def via_c(ask, target):
    # C code between this frame and the package's: sorted calls the key, as pybind11 calls a Python override
    # (CPython 3.12+ puts an entry record of the C stack between the two frames)
    return sorted([target], key=lambda t: ask(t))[0] is target and ask(target)

def from_generator(ask, target):
    def steps():
        yield ask(target)
    return next(steps())

def from_comprehension(ask, target):
    return [ask(target) for _ in range(1)][0]
""")


WAYS = ["direct", "via_c", "from_generator", "from_comprehension"]


@pytest.mark.parametrize("way", WAYS)
def test_the_module_that_called_in(way):
    user = _user()
    assert getattr(user, way)(_ASKS.ask, vars(user)) is True


@pytest.mark.parametrize("way", WAYS)
def test_another_module(way):
    user, other = _user(), _user("other_code")
    assert getattr(user, way)(_ASKS.ask, vars(other)) is False


def test_through_the_package_layers():
    user = _user()
    assert user.via(_LAYER.through, _ASKS.ask, vars(user)) is True


def test_only_the_innermost_outside_module():
    """A module further out than the first one outside the package is not the caller: torch's wrappers called by
    user code are the wrappers' call, the group's method called by user code inside a wrapper's module is not."""
    outer = _user("outer_code")
    inner = _module("inner_code", "def direct(ask, target):\n    return ask(target)\n")
    outer_calls = _module("outer_calls", "def run(inner, ask, target):\n    return inner.direct(ask, target)\n")
    assert outer_calls.run(inner, _ASKS.ask, vars(outer_calls)) is False
    assert outer_calls.run(inner, _ASKS.ask, vars(inner)) is True
    assert outer.direct(_ASKS.ask, vars(inner)) is False


def test_called_from_here():
    """Asked from this test module itself (no package frame in between)."""
    assert caller_is(globals()) is True
    assert caller_is(vars(_ASKS)) is False
