"""bench/peer_deepspeed.py with a wrong DeepSpeed result planted, to check that it refuses to report it.

Run like bench/peer_deepspeed.py (under torchrun, same options): DeepSpeed's all_reduce gives the last rank
a result off by one in its last element; the check must catch that on every rank and exit 3.  Used by
tests/test_peer_deepspeed.py.
"""
import os
import sys

import torch.distributed as dist

# bench/ is not a package: import the benchmark from its folder, beside this one's.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import peer_deepspeed  # noqa: E402

_callers = peer_deepspeed.callers


def _wrong_on_last_rank(groups, deepspeed):
    call = _callers(groups, deepspeed)
    right = call[peer_deepspeed.DEEPSPEED]
    if dist.get_rank() != dist.get_world_size() - 1:
        return call

    def wrong(t):
        fn = right(t)

        def run():
            fn()
            t.view(-1)[-1] += 1
        return run
    call[peer_deepspeed.DEEPSPEED] = wrong
    return call


if __name__ == "__main__":
    peer_deepspeed.callers = _wrong_on_last_rank
    sys.exit(peer_deepspeed.main())
