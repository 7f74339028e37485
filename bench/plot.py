#!/usr/bin/env python3
"""Plot sweep results (PNG, or any format matplotlib writes from the extension)::

    python bench/plot.py results/sweep-2ranks.json results/sweep-2ranks.png
    python bench/plot.py results/sweep-2ranks.json results/mpi-2ranks.json results/sweep-2ranks.png

Every file but the last is a JSON document of bench/sweep.py or bench/mpi_sweep.py; they are
merged (rows matched by op, dtype and bytes) so shm, gloo and MPI share one figure.  The code
lives in src/shmcoll/bench/plot.py, which ``python -m shmcoll bench`` uses too; ``--help`` lists
the options.
"""
import runpy

if __name__ == "__main__":
    runpy.run_module("shmcoll.bench.plot", run_name="__main__", alter_sys=True)
