"""PyTorch's own DistributedTest (from the installed torch) on shm, as torch's CI runs it for Gloo.

    python -m tests.torch_suite                      # every test, BACKEND=shm, world size 2
    python -m tests.torch_suite --gates-as-gloo      # torch's backend-name gates evaluated as Gloo
    python -m tests.torch_suite --backend gloo       # the reference run
    python -m tests.torch_suite -k all_reduce -k ddp # a selection (names containing these)
    python -m tests.torch_suite --test test_barrier  # tests of exactly these names
    python -m tests.torch_suite --fork ...           # each test's ranks forked from this process, not spawned

torch skips many tests at import time by backend name (``require_backend``,
"only supported on mpi, nccl and gloo"), which says nothing about whether shm
could run them. With ``--gates-as-gloo`` the module is imported while
$BACKEND says "gloo", then its BACKEND is set to "shm", so those tests run on
shm. The settings travel in the environment, because torch's test case
spawns fresh processes per test, which import this module again. With
``--fork`` they are forked from this process instead (as torch's fork variant
of the suite did): each test then starts in about a second rather than in
the five or six that two fresh imports of torch take on 2 cores.
"""
from __future__ import annotations

import os
import sys
import tempfile

os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="torch-suite-"))  # shared with the spawned ranks
BACKEND = os.environ.setdefault("SHMCOLL_SUITE_BACKEND", "shm")
START = os.environ.get("SHMCOLL_SUITE_START", "spawn")  # how each test's ranks start: "spawn" or "fork"
GATES = os.environ.get("SHMCOLL_SUITE_GATES") or BACKEND

os.environ["BACKEND"] = GATES  # what the decorators see while the module is imported
import torch.multiprocessing  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402

distributed_test.BACKEND = BACKEND  # what the tests run on
os.environ["BACKEND"] = BACKEND


class TorchDistributedTest(distributed_test.TestDistBackend, distributed_test.DistributedTest._DistTestBase):
    """torch's test_distributed_spawn.py (its TestDistBackendWithSpawn), for one backend, its ranks spawned or
    forked."""

    def setUp(self):
        super().setUp()
        if START == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


def main(argv: list[str]) -> int:
    import argparse
    import unittest

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="shm")
    parser.add_argument("--gates-as-gloo", action="store_true")
    parser.add_argument("-k", action="append", default=[], help="run tests whose name contains this")
    parser.add_argument("--test", action="append", default=[], help="run the test of exactly this name")
    parser.add_argument("--fork", action="store_true", help="fork each test's ranks from this process")
    args = parser.parse_args(argv)
    start = "fork" if args.fork else "spawn"
    if args.backend != BACKEND or (args.gates_as_gloo and GATES != "gloo") or start != START:
        # Settings are read at import (see the module docstring): start again with them in the environment.
        env = {**os.environ, "SHMCOLL_SUITE_BACKEND": args.backend,
               "SHMCOLL_SUITE_GATES": "gloo" if args.gates_as_gloo else "", "SHMCOLL_SUITE_START": start}
        os.execve(sys.executable, [sys.executable, "-m", "tests.torch_suite", *argv], env)
    loader = unittest.TestLoader()
    # unittest matches patterns against "module.Class.test_name".
    loader.testNamePatterns = [f"*{k}*" for k in args.k] + [f"*.{name}" for name in args.test] or None
    suite = loader.loadTestsFromTestCase(TorchDistributedTest)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    print(f"torch DistributedTest on {BACKEND}" + (" (gates as gloo)" if GATES != BACKEND else "") +
          f": {result.testsRun - len(result.failures) - len(result.errors) - len(result.skipped)} passed, "
          f"{len(result.failures) + len(result.errors)} failed, {len(result.skipped)} skipped")
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
