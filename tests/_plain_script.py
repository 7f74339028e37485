import sys

import torch
import torch.distributed as dist

dist.init_process_group("shm")
assert "shmcoll" not in sys.argv[0]
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.arange(10, dtype=torch.float32) * (rank + 1)
dist.all_reduce(t)
expected = torch.arange(10, dtype=torch.float32) * sum(range(1, world + 1))
assert torch.equal(t, expected), (t, expected)
assert dist.get_backend() == "shm"
print(f"rank {rank}: all_reduce ok")
dist.destroy_process_group()
