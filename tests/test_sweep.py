"""The benchmark sweep (shmcoll_bench.sweep) runs, writes its document, and refuses a wrong result.

Two quick sweeps at 2 ranks under torchrun, shm against Gloo, four ops at two sizes: one
must exit 0 with a row per point and a ratio for each, the other, with a wrong result
planted by tests/sweep_fault.py, must exit 3 naming the backend.
"""
from __future__ import annotations

import json
import subprocess

from tests.harness import REPO, rank_environment, torchrun_command

SWEEP_ARGS = ["--backends", "shm,gloo", "--quick", "--dtypes", "float32", "--min-bytes", "8",
              "--max-bytes", "64K", "--memcpy-bytes", "1M"]


def run_sweep(module_or_script: str, *args: str) -> subprocess.CompletedProcess:
    command = torchrun_command(2, module_or_script, *SWEEP_ARGS, *args)
    return subprocess.run(command, cwd=REPO, env=rank_environment(),
                          capture_output=True, text=True, timeout=300)


def test_sweep_reports_every_point(tmp_path):
    document = tmp_path / "sweep.json"
    done = run_sweep("shmcoll_bench.sweep", "--json", str(document), "--pin")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(document.read_text())["config"]["pinned"] is True
    assert "local rank r of n bound to the r-th of n shares of the CPUs" in done.stdout
    rows = json.loads(document.read_text())["rows"]
    ops = {row["op"] for row in rows}
    assert ops == {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast"}
    for row in rows:
        assert row["results"]["shm"]["status"] == "ok" and row["results"]["gloo"]["status"] == "ok", row
        assert row["ratio"]["gloo/shm"] > 0, row
    assert "| all_reduce" in done.stdout


def test_sweep_refuses_a_wrong_result():
    done = run_sweep("tests.sweep_fault", "--ops", "all_reduce")
    # torchrun exits 1 when a rank fails and names the rank's own status.
    assert done.returncode != 0 and "exitcode: 3" in done.stderr, done.stdout + done.stderr
    assert "correctness check failed" in done.stderr and "backend(s) shm" in done.stderr, done.stderr
