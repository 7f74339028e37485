"""The benchmark sweep with a wrong result planted, to check that it refuses to report it.

Run like shmcoll_bench.sweep (under torchrun, same options).  The default process group's
backend (the first of --backends) gives the last rank a result off by one in its last
element; the sweep's correctness check must catch that on every rank and exit 3.  Used by
tests/test_sweep.py.
"""
import sys

import torch.distributed as dist

from shmcoll_bench import cases, sweep

_call = cases.OpCase.fn


def _wrong_on_last_rank(case, group, inp, out):
    call = _call(case, group, inp, out)
    if group is not dist.group.WORLD or case.rank != case.world - 1:
        return call

    def wrong():
        call()
        (out if out is not None else inp).view(-1)[-1] += 1
    return wrong


if __name__ == "__main__":
    cases.OpCase.fn = _wrong_on_last_rank
    sys.exit(sweep.main())
