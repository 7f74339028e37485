"""Benchmark tooling behind ``python -m shmcoll bench``: the sweep, its MPI twin, results and plots."""
