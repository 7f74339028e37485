"""A torch newer than the newest tested is used all the same, with one warning per process."""
import logging
import threading

import pytest
import torch

from shmcoll import _torch_compat

NEWEST = ".".join(map(str, _torch_compat.NEWEST_TESTED))
NEWER = f"{_torch_compat.NEWEST_TESTED[0]}.{_torch_compat.NEWEST_TESTED[1] + 1}.0"


@pytest.fixture
def fresh_process(monkeypatch):
    """As if no group had been created in this process yet (the warning not yet given)."""
    monkeypatch.setattr(_torch_compat, "_warned", threading.Lock())


def _warnings(caplog):
    return [r for r in caplog.records if r.name == "shmcoll" and r.levelno == logging.WARNING]


def test_newer_torch_warns_once_naming_both_versions(monkeypatch, caplog, fresh_process):
    monkeypatch.setattr(torch, "__version__", NEWER + "+cpu")
    with caplog.at_level(logging.WARNING, logger="shmcoll"):
        for _ in range(3):  # three groups in one process
            _torch_compat.warn_if_untested()
    warnings = _warnings(caplog)
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert f"torch {NEWER}+cpu" in warnings[0].getMessage() and f"({NEWEST})" in warnings[0].getMessage()


@pytest.mark.parametrize("version", ["2.12.0", "2.13.0+cpu", f"{NEWEST}.1", f"{NEWEST}.0.dev20261201+cpu", "2.11.0"])
def test_tested_or_older_torch_says_nothing(monkeypatch, caplog, fresh_process, version):
    monkeypatch.setattr(torch, "__version__", version)
    with caplog.at_level(logging.WARNING, logger="shmcoll"):
        _torch_compat.warn_if_untested()
    assert _torch_compat.untested() is None and not _warnings(caplog)


@pytest.mark.parametrize("version", [NEWER, f"{NEWER}.dev20270101+cpu", "3.0.0", f"2.{_torch_compat.NEWEST_TESTED[1] + 10}.1"])
def test_every_newer_release_is_untested(version):
    assert _torch_compat.untested(version) is not None
