"""The benchmarks' --pin (shmcoll.bench.timing.pin): local rank r on CPU r modulo the affinity mask."""
import subprocess
import sys

_PIN = """
import os
from shmcoll.bench.timing import pin
cpus = sorted(os.sched_getaffinity(0))
got = pin({rank})
print(got == cpus[{rank} % len(cpus)], os.sched_getaffinity(0) == {{got}})
"""


def test_a_rank_is_pinned_to_its_cpu_modulo_the_mask():
    for rank in (0, 1, 5):  # in a child: pinning this test's process would pin the rest of the run
        done = subprocess.run([sys.executable, "-c", _PIN.format(rank=rank)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["True", "True"], (rank, done.stdout)
