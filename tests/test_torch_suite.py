"""PyTorch's own DistributedTest on shm: CI runs a quick subset; TESTING.md has the full runs' counts.

The subset runs with torch's backend-name gates evaluated as Gloo (see
tests/torch_suite.py), so that tests torch would skip for any backend not
named "gloo" run on shm; it includes the ones shm once failed
(all_gather_coalesced's layout, get_future with default options, sparse
all_reduce, the "Timed out" wording of a barrier timeout).
"""
import os
import subprocess
import sys

from tests.harness import REPO

QUICK = ["test_all_reduce_sum", "test_all_reduce_coalesced_sum", "test_reduce_sum", "test_broadcast",
         "test_all_gather", "test_all_gather_coalesced_simple", "test_gather", "test_scatter",
         "test_barrier", "test_send_recv", "test_isend",
         "test_get_future", "test_sparse_all_reduce_sum", "test_barrier_timeout_full_group",
         "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
         "test_ddp_logging_data_cpu"]


def test_quick_subset_with_gates_as_gloo():
    command = [sys.executable, "-m", "tests.torch_suite", "--gates-as-gloo", "--fork"]
    for name in QUICK:
        command += ["--test", name]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, (summary, proc.stderr[-6000:])
    passed = int(summary.split(": ")[1].split(" passed")[0])
    assert passed == len(QUICK), (summary, proc.stdout[-6000:])  # none skipped: each runs on CPU
