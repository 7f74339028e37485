"""One rank of a test job: ``python -m tests.worker module:function [args]``.

Initialises the default group with $SHMCOLL_TEST_BACKEND (env:// rendezvous),
runs the scenario, which records each case through ``Cases``, and writes the
report to $SHMCOLL_TEST_REPORT.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist


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

    def check(self, name: str, condition: bool, message: str = "") -> None:
        self.results[name] = None if condition else (message or "check failed")


def main() -> int:
    target, *args = sys.argv[1:]
    module_name, function_name = target.split(":")
    torch.set_num_threads(1)
    dist.init_process_group(os.environ["SHMCOLL_TEST_BACKEND"], init_method="env://")
    cases = Cases()
    extra = getattr(importlib.import_module(module_name), function_name)(cases, *args) or {}
    report = {"cases": cases.results, **extra}
    # Launchers that share one environment among ranks (torchrun) name the file with "{rank}".
    with open(os.environ["SHMCOLL_TEST_REPORT"].replace("{rank}", str(dist.get_rank())), "w") as f:
        json.dump(report, f)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
