"""The examples in examples/ run as their docstrings say, and give the same results on shm and on Gloo.

Each example runs through torchrun at 2 ranks, once per backend, with settings
small enough that a run costs little more than starting the ranks (about 5 s
on 2 cores), and writes its --json results. At 2 ranks every sum in these
examples adds two numbers, so the backends agree exactly; the 1e-5 tolerance
only leaves room for a future backend that rounds differently.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.harness import REPO, free_port

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
WORLD_SIZE = 2
BACKENDS = ("shm", "gloo")
LOSS_RTOL = 1e-5

TINY = {
    "ddp.py": ["--steps", "3", "--warmup", "1", "--batch", "8", "--hidden", "64", "--layers", "3"],
    "fsdp2.py": ["--steps", "3", "--warmup", "1", "--batch", "2", "--seq", "16", "--dim", "64",
                         "--layers", "2", "--heads", "2", "--vocab", "64"],
    "tp_inference.py": ["--tokens", "4", "--warmup", "1", "--layers", "2", "--hidden", "128",
                                "--batch", "2"],
    "tp_dtensor.py": ["--tokens", "4", "--warmup", "1", "--layers", "2", "--hidden", "128", "--batch", "2"],
}


def run_example(script: str, backend: str, tmp_path) -> tuple[dict, str]:
    """Run ``examples/<script>`` under torchrun the way a user would; return its JSON results and rank 0's output."""
    results = tmp_path / f"{script}-{backend}.json"
    command = [TORCHRUN, f"--nproc_per_node={WORLD_SIZE}", "--master_port", str(free_port()),
               os.path.join("examples", script), "--backend", backend, "--json", str(results), *TINY[script]]
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{' '.join(command)} exited {out.returncode}:\n{out.stdout}\n{out.stderr[-4000:]}"
    assert results.exists(), f"{script} --backend {backend} wrote no {results}:\n{out.stdout}"
    data = json.loads(results.read_text())
    assert data["backend"] == backend and data["world_size"] == WORLD_SIZE, data
    return data, out.stdout


@pytest.mark.parametrize("script, name", [("ddp.py", "ddp"), ("fsdp2.py", "fsdp2")])
def test_training_example_gives_the_same_losses_on_both_backends(script, name, tmp_path):
    runs = {backend: run_example(script, backend, tmp_path) for backend in BACKENDS}
    for backend, (data, stdout) in runs.items():
        assert f"{name} {backend:>4} world={WORLD_SIZE}: median step" in stdout, stdout
        assert data["median_step_ms"] > 0 and data["steps_per_s"] > 0, data
        assert len(data["losses"]) == 4 and math.isfinite(data["final_loss"]), data
    shm, gloo = runs["shm"][0], runs["gloo"][0]
    assert math.isclose(shm["final_loss"], gloo["final_loss"], rel_tol=LOSS_RTOL), (shm["losses"], gloo["losses"])
    assert all(math.isclose(a, b, rel_tol=LOSS_RTOL) for a, b in zip(shm["losses"], gloo["losses"])), \
        (shm["losses"], gloo["losses"])


@pytest.mark.compat
def test_dtensor_example_passes_its_check_on_both_backends(tmp_path):
    """parallelize_module's functional all_reduces on shm, as on Gloo."""
    for backend in BACKENDS:
        data, stdout = run_example("tp_dtensor.py", backend, tmp_path)
        assert data["check"]["passed"] and data["check"]["rel_error"] <= data["check"]["tolerance"], data
        assert "check against the single-rank computation: ok" in stdout, stdout
        assert f"tp_dtensor {backend:>4} world={WORLD_SIZE}:" in stdout and data["tokens_per_s"] > 0, stdout


def test_tensor_parallel_example_passes_its_check_on_both_backends(tmp_path):
    for backend in BACKENDS:
        data, stdout = run_example("tp_inference.py", backend, tmp_path)
        assert data["check"]["passed"] and data["check"]["rel_error"] <= data["check"]["tolerance"], data
        assert "check against the single-rank computation: ok" in stdout, stdout
        assert f"tp_inference {backend:>4} world={WORLD_SIZE}:" in stdout, stdout
        assert data["tokens_per_s"] > 0 and 0 < data["all_reduce_share"] < 1, data
