"""The benchmarks' --pin (shmcoll_bench.timing.pin): local rank r of n on the r-th of n shares of the affinity
mask, or on CPU r modulo the mask where ranks outnumber its CPUs."""
import os
import subprocess
import sys

_PIN = """
import os
os.sched_setaffinity(0, {mask})
from shmcoll_bench.timing import pin
got = pin({rank}, {ranks})
print(got == {expected}, os.sched_getaffinity(0) == set({expected}))
"""


def _pinned(mask, rank: int, ranks: int, expected) -> None:
    # in a child: pinning this test's process would pin the rest of the run
    done = subprocess.run([sys.executable, "-c", _PIN.format(mask=mask, rank=rank, ranks=ranks, expected=expected)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"], (mask, rank, ranks, done.stdout)


def test_a_rank_is_pinned_to_its_cpu_modulo_the_mask():
    """More ranks than CPUs: one CPU each, r modulo the mask."""
    cpus = sorted(os.sched_getaffinity(0))
    for rank in (0, 1, 5):
        _pinned(cpus, rank, max(6, len(cpus)), [cpus[rank % len(cpus)]])


def test_a_rank_of_fewer_than_the_cpus_gets_its_share():
    """Fewer ranks than CPUs: consecutive equal shares (the mask's own CPUs, whatever their numbers)."""
    mask = sorted(os.sched_getaffinity(0))[:1]
    for rank in range(2):  # one CPU for 2 ranks: each has it
        _pinned(mask, rank, 2, mask)
    if len(os.sched_getaffinity(0)) >= 2:
        cpus = sorted(os.sched_getaffinity(0))[:2]
        _pinned(cpus, 0, 1, cpus)  # one rank: the whole mask
        _pinned(cpus, 1, 2, cpus[1:])
