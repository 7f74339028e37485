"""The supported torch releases are one fact (shmcoll.torch_releases), which every statement of them follows; a
torch newer than the newest tested is used all the same, with one warning per process saying how to check it."""
import logging
import re
import subprocess
import sys
import threading
import tomllib

import pytest
import torch

from shmcoll import _torch_compat, torch_releases
from tests.harness import REPO

# The compatibility tier (TESTING.md, "Every torch"): this whole file runs on every supported torch in CI.
pytestmark = pytest.mark.compat

RELEASES = torch_releases.RELEASES
OLDEST = ".".join(map(str, torch_releases.OLDEST_SUPPORTED))
NEWEST = ".".join(map(str, torch_releases.NEWEST_TESTED))
NEWER = f"{torch_releases.NEWEST_TESTED[0]}.{torch_releases.NEWEST_TESTED[1] + 1}.0"


def test_releases_are_in_order_and_name_the_range():
    assert RELEASES == tuple(sorted(RELEASES, key=lambda r: tuple(map(int, r.split("."))))), RELEASES
    assert (OLDEST, NEWEST) == (RELEASES[0].rsplit(".", 1)[0], RELEASES[-1].rsplit(".", 1)[0])


def test_the_scripts_read_the_releases_from_the_module():
    out = subprocess.run([sys.executable, str(REPO / "src" / "shmcoll" / "torch_releases.py")], capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == list(RELEASES), out.stdout


def test_pyproject_requires_the_oldest():
    with open(REPO / "pyproject.toml", "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    assert [d.replace(" ", "") for d in dependencies if d.startswith("torch")] == [f"torch>={OLDEST}"], dependencies


def test_readme_states_the_range_and_every_release():
    readme = (REPO / "README.md").read_text()
    assert f"The dependency\non torch is `torch>={OLDEST}`" in readme and f"torch {OLDEST} or newer." in readme
    (row,) = re.findall(r"^\| torch \| (.*) \|$", readme, re.M)
    supported, tested = row.split(" | ")
    assert supported == f"{OLDEST} or newer", row
    assert re.findall(r"\b\d+\.\d+\.\d+\b", tested.split(":")[0]) == list(RELEASES), row


def test_design_lists_every_release():
    design = (REPO / "docs" / "DESIGN.md").read_text()
    (supported,) = re.findall(r"On every supported torch \(([\d., ]+)\)", design)
    assert supported.split(", ") == [r.rsplit(".", 1)[0] for r in RELEASES], supported


def test_the_pinned_torch_is_a_supported_release():
    """.ci/setup's torch, the main suite's in CI, is one of the releases (the matrix runs the others)."""
    (pinned,) = re.findall(r"torch==(\d+\.\d+\.\d+)", (REPO / ".ci" / "setup").read_text())
    assert pinned in RELEASES, (pinned, RELEASES)


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
    assert f"`bash tests/matrix.sh {NEWER}`" in warnings[0].getMessage()  # what to run to check it


@pytest.mark.parametrize("version", [*RELEASES, "2.13.0+cpu", f"{NEWEST}.1", f"{NEWEST}.0.dev20261201+cpu", "2.11.0"])
def test_tested_or_older_torch_says_nothing(monkeypatch, caplog, fresh_process, version):
    monkeypatch.setattr(torch, "__version__", version)
    with caplog.at_level(logging.WARNING, logger="shmcoll"):
        _torch_compat.warn_if_untested()
    assert _torch_compat.untested() is None and not _warnings(caplog)


@pytest.mark.parametrize("version", [NEWER, f"{NEWER}.dev20270101+cpu", "3.0.0", f"2.{torch_releases.NEWEST_TESTED[1] + 10}.1"])
def test_every_newer_release_is_untested(version):
    assert _torch_compat.untested(version) is not None
