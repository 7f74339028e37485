"""One rank of a test job: ``python -m tests.worker module:function [args]``.

Initialises the default group with $SHMCOLL_TEST_BACKEND (env:// rendezvous),
runs the scenario, which records each case through ``Cases``, destroys the
group, and writes the report to $SHMCOLL_TEST_REPORT: the cases, and the
segments this process still maps or holds open (``tests.leaks``).
"""
from __future__ import annotations

import ctypes
import importlib
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

from tests import fault_hooks, leaks


class Cases:
    """Collects case outcomes; a case is a callable that raises on failure."""

    def __init__(self):
        self.results: dict[str, str | None] = {}

    def run(self, name: str, fn, *args, **kwargs):
        try:
            fn(*args, **kwargs)
            self.results[name] = None
        except Exception as error:  # report and go on: one job, many cases
            self.results[name] = f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=4)}"

    def run_each(self, checks: dict, *args) -> None:
        """Run every check of {case name: check} in order, each with ``args``."""
        for name, check in checks.items():
            self.run(name, check, *args)

    def check(self, name: str, condition: bool, message: str = "") -> None:
        self.results[name] = None if condition else (message or "check failed")


def main() -> int:
    target, *args = sys.argv[1:]
    module_name, function_name = target.split(":")
    torch.set_num_threads(1)
    if os.environ.get("SHMCOLL_TEST_NOT_DUMPABLE"):
        # tests/test_single_copy.py: peers without CAP_SYS_PTRACE may then not read this process's memory.
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    fault_hooks.install_from_environment()
    before = leaks.references()
    dist.init_process_group(os.environ["SHMCOLL_TEST_BACKEND"], init_method="env://")
    rank = dist.get_rank()
    cases = Cases()
    extra = getattr(importlib.import_module(module_name), function_name)(cases, *args) or {}
    if dist.is_initialized():
        dist.destroy_process_group()
    # Every group is gone: none of its segments may still be mapped or open here.
    report = {"cases": cases.results, "leaks": leaks.new_references(before), **extra}
    # Launchers that share one environment among ranks (torchrun) name the file with "{rank}".
    with open(os.environ["SHMCOLL_TEST_REPORT"].replace("{rank}", str(rank)), "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
