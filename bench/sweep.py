#!/usr/bin/env python3
"""The interleaved shm-vs-gloo sweep of BENCHMARKS.md.  Run under torchrun::

    torchrun --nproc_per_node=2 bench/sweep.py --quick                  # smoke test (< 20 s)
    torchrun --nproc_per_node=2 bench/sweep.py --json results/sweep-2ranks.json

The code lives in src/shmcoll/bench/sweep.py (``torchrun ... -m shmcoll.bench.sweep`` is the same thing): it
ships with the package so that ``python -m shmcoll bench`` can run it from an installed
shmcoll.  This file stays so that the commands above, bench/run.sh and BENCHMARKS.md keep
working; ``--help`` lists the options.
"""
import runpy

if __name__ == "__main__":
    runpy.run_module("shmcoll.bench.sweep", run_name="__main__", alter_sys=True)
