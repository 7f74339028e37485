"""shmcoll's benchmarks, a package apart from the backend: the shm-vs-Gloo sweep, its Open MPI twin, their
results and plots, and ``python -m shmcoll_bench``, which runs all of them at once (bench/pyproject.toml)."""
