"""Installed as people install it (long tier: ``-m long``, TESTING.md).

A wheel built from this checkout goes into a new virtual environment that
already has torch: the install keeps that torch (the dependency is only
``torch>=2.12``), and a 2-rank torchrun job started outside the source tree,
whose script never imports shmcoll, finds "shm" through the ``torch.backends``
entry point alone. Nothing here may see the checkout: every command runs
without PYTHONPATH, so a broken wheel cannot be hidden by the source tree.

Minutes, not seconds: it compiles the extensions, installs torch, NumPy and
Numba into the new environment from pip's index (torch at the version this
suite runs on; on this project's machines the CPU build on disk), and the
job's first group builds the kernel library.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from tests.harness import REPO

pytestmark = pytest.mark.long

# What a user's script is: torch alone, the backend by name.
SCRIPT = r"""
import sys
import torch
import torch.distributed as dist

dist.init_process_group("shm")
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((1000,), float(size * (size + 1) // 2))), t[:4]
dist.barrier()
assert dist.get_backend() == "shm", dist.get_backend()
sys.stdout.write(f"rank {rank}: all_reduce ok, shmcoll from {sys.modules['shmcoll'].__file__}\n")  # one write
dist.destroy_process_group()
"""


# Every command sees what a user's shell would: nothing that points into the checkout.
USER_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}


def _run(command, timeout=900, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=USER_ENV, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, command))} exited {done.returncode}:\n" \
                                 f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def _checkout_copy(into):
    """The files a clone of this working tree has (tracked, and new ones git does not ignore): the wheel
    must build from those, not from build products lying in the checkout."""
    listed = _run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"])
    for name in filter(None, listed.stdout.split("\0")):
        source = REPO / name
        if source.is_file():  # a deleted file still listed as tracked is not there to copy
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def _torch_install(python):
    """torch's version and the identity of one of its files: a reinstall, even of the same version,
    replaces the file (a new inode)."""
    out = _run([python, "-c", "import os, torch, torch.version as v; s = os.stat(v.__file__); "
                              "print(torch.__version__, s.st_ino, s.st_mtime_ns)"])
    return out.stdout.split()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel of this checkout, built as `pip install .` builds it (isolated: setuptools and Cython)."""
    source = _checkout_copy(tmp_path_factory.mktemp("checkout"))
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", str(dist),
          str(source)])
    (built,) = dist.glob("shmcoll-*.whl")
    return built


@pytest.fixture(scope="module")
def user_env(tmp_path_factory):
    """A new virtual environment holding only the torch this suite runs on (its public version)."""
    venv = tmp_path_factory.mktemp("user") / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
          f"torch=={torch.__version__.split('+')[0]}"])
    return venv


def test_wheel_keeps_torch_and_serves_a_torchrun_job_without_import(wheel, user_env, tmp_path):
    python = str(user_env / "bin" / "python")
    before = _torch_install(python)
    installed = _run([python, "-m", "pip", "install", "--disable-pip-version-check", str(wheel)])
    assert "Uninstalling torch" not in installed.stdout, installed.stdout
    assert _torch_install(python) == before, "installing the wheel replaced the environment's torch"

    job = tmp_path / "job"  # a folder of the user's, outside the source tree
    job.mkdir()
    (job / "train.py").write_text(SCRIPT)
    env = dict(USER_ENV, OMP_NUM_THREADS="1")  # torchrun's default; set, so it prints no notice
    out = subprocess.run([str(user_env / "bin" / "torchrun"), "--standalone", "--nproc_per_node=2", "train.py"],
                         cwd=job, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    # The ranks share one pipe: count what they wrote, not lines.
    assert out.stdout.count("all_reduce ok") == 2, out.stdout + out.stderr
    found = re.findall(r"shmcoll from (\S+)", out.stdout)
    assert len(found) == 2 and all(p.startswith(str(user_env / "lib")) for p in found), found
