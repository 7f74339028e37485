"""The torch entry point: 'shm' exists after `import torch` alone, cheaply and idempotently."""
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from shmcoll import _torch_compat
from tests.harness import REPO, free_port, shm_entries

# The compatibility tier (TESTING.md, "Every torch"): this whole file runs on every supported torch in CI.
pytestmark = pytest.mark.compat


def _python(code):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd="/", timeout=120)


def test_import_torch_registers_shm_without_loading_heavy_modules():
    out = _python("""
        import sys, torch, torch.distributed as dist
        assert "shm" in dist.Backend.backend_list, dist.Backend.backend_list
        heavy = [m for m in ("numba", "shmcoll.collectives", "shmcoll._segment", "shmcoll.kernels") if m in sys.modules]
        assert not heavy, heavy
        import shmcoll
        assert shmcoll.register_backend() and shmcoll.register_backend()  # idempotent
        print("ok")
    """)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_torchrun_script_without_import_of_shmcoll():
    """The acceptance script: only torch, init_process_group("shm"), all_reduce, at 3 ranks."""
    script = os.path.join(REPO, "tests", "_plain_script.py")
    before = shm_entries()
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=3", "--master_port", str(free_port()),
         script], capture_output=True, text=True, timeout=300, cwd="/")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("all_reduce ok") == 3, out.stdout + out.stderr
    assert shm_entries() - before == set()


def test_newer_torch_than_tested_warns_once_per_process():
    """The first shm group of a process on a torch newer than the newest tested logs one warning (not an
    error); the groups after it say nothing more."""
    out = _python("""
        import torch, torch.distributed as dist
        from shmcoll import torch_releases
        major, minor = torch_releases.NEWEST_TESTED
        torch.__version__ = f"{major}.{minor + 1}.0"
        dist.init_process_group("shm", store=dist.HashStore(), rank=0, world_size=1)
        for _ in range(2):
            t = torch.ones(4)
            dist.all_reduce(t, group=dist.new_group([0]))
        dist.destroy_process_group()
        print("ok")
    """)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert out.stderr.count("is newer than the newest torch shmcoll was tested on") == 1, out.stderr


def test_info_command_runs_without_torchrun():
    out = subprocess.run([sys.executable, "-m", "shmcoll", "info"], capture_output=True, text=True, timeout=120,
                         cwd="/", env={**os.environ, "SHMCOLL_CHUNK_BYTES": "1M"})
    assert out.returncode == 0, out.stderr
    for expected in ("torch entry point", "shmcoll._autoload:register", "/dev/shm", "kernel library"):
        assert expected in out.stdout, (expected, out.stdout)
    # the torch, against the releases tested, and what of torch's internals differs (torch_internals)
    from shmcoll import torch_internals, torch_releases

    rows = dict(re.findall(r"^(\S.*?)  +(.*)$", out.stdout, re.M))
    range_ = _torch_compat.untested() or f"tested on {', '.join(torch_releases.RELEASES)}"
    assert rows["torch"] == f"{torch.__version__} ({range_})", rows["torch"]
    differ = [item for item, answer in torch_internals.results("shm", every=True) if answer is not None]
    assert rows["torch internals"] == (
        f"as shmcoll takes them ({len(torch_internals.ITEMS)} checked)" if not differ else
        f"{len(differ)} of {len(torch_internals.ITEMS)} differ from what shmcoll takes:"), rows["torch internals"]
    fallbacks = re.findall(r"^  fallback +(.*)$", out.stdout, re.M)
    assert [line.split(": ")[0] for line in fallbacks] == [item.takes for item in differ], fallbacks
    lines = {line.split()[0]: line.split()[-1] for line in out.stdout.splitlines() if line.strip()}
    assert lines["$SHMCOLL_CHUNK_BYTES"] == "1M" and lines["chunk_bytes"] == "1048576", out.stdout


def test_bad_setting_names_its_variable():
    out = _python("""
        import os
        os.environ["SHMCOLL_CHUNK_BYTES"] = "lots"
        from shmcoll import _env
        try:
            _env.read_settings()
        except ValueError as error:
            print(error)
    """)
    assert "SHMCOLL_CHUNK_BYTES='lots'" in out.stdout, out.stdout + out.stderr


def test_every_package_directory_is_packaged():
    """A non-editable install (pip install .) ships exactly the packages pyproject.toml lists."""
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    src = os.path.join(REPO, "src")
    found = {os.path.relpath(root, src).replace(os.sep, ".")
             for root, _, files in os.walk(os.path.join(src, "shmcoll")) if "__init__.py" in files}
    assert listed == found, f"pyproject.toml lists {sorted(listed)}, the tree has {sorted(found)}"


def test_install_keeps_the_users_torch():
    """What pip reads before it builds: no torch in the isolated build environment (the extension is
    plain Cython; a torch there would be another download of several GB), and torch as a lower bound
    only, which the torch a user has already satisfies (tests/test_install.py installs for real)."""
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert not [r for r in project["build-system"]["requires"] if r.lower().startswith("torch")]
    (torch_dependency,) = [r for r in project["project"]["dependencies"] if r.lower().startswith("torch")]
    assert torch_dependency.replace(" ", "").startswith("torch>=") and "," not in torch_dependency, torch_dependency


def test_every_variable_is_documented():
    """Each SHMCOLL_* name the package reads appears in README.md's variable table."""
    import re

    from tests.harness import REPO

    used = set()
    for path in (REPO / "src" / "shmcoll").rglob("*.py"):
        used |= set(re.findall(r"SHMCOLL_[A-Z_]+[A-Z]", path.read_text()))
    table = {m for m in re.findall(r"^\| `(SHMCOLL_[A-Z_]+)`", (REPO / "README.md").read_text(), re.M)}
    assert used and used <= table, f"undocumented: {sorted(used - table)}"
