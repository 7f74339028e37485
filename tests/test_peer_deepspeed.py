"""DeepSpeed's shm all_reduce as a peer (bench/peer_deepspeed.py): a short job at 2 ranks reports every
point with all three backends, and a wrong DeepSpeed result planted by tests/peer_deepspeed_fault.py makes
it exit 3.  Skipped where DeepSpeed is not installed (the optional ``peers`` extra); its op is compiled on
the first run (a minute or more on 2 cores)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.harness import REPO, free_port, rank_environment

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                reason="DeepSpeed is not installed (pip install -e './bench[peers]')")

ARGS = ["--quick", "--min-bytes", "8", "--max-bytes", "64K", "--iters-time", "0.005"]


def run_job(script: str, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}",
               script, *ARGS, *args]
    return subprocess.run(command, cwd=REPO, env=rank_environment(), capture_output=True, text=True, timeout=600)


def test_every_point_has_all_three_backends(tmp_path):
    document = tmp_path / "peer.json"
    done = run_job("bench/peer_deepspeed.py", "--json", str(document))
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(document.read_text())
    assert doc["config"]["backends"] == ["shm", "gloo", "deepspeed"]
    assert {row["dtype"] for row in doc["rows"]} == {"float32", "bfloat16"}
    for row in doc["rows"]:
        for label in ("shm", "gloo", "deepspeed"):
            assert row["results"][label]["status"] == "ok", row
        assert row["ratio"]["deepspeed/shm"] > 0 and row["ratio"]["gloo/shm"] > 0, row
        assert "bitwise_equal" in row["results"]["deepspeed"]["vs_shm"], row
    assert "| all_reduce" in done.stdout and "deepspeed/shm x" in done.stdout


def test_a_wrong_deepspeed_result_is_refused():
    done = run_job("tests/peer_deepspeed_fault.py", "--dtypes", "float32")
    assert done.returncode != 0 and "exitcode: 3" in done.stderr, done.stdout + done.stderr
    assert "backend(s) deepspeed disagree" in done.stderr, done.stderr
