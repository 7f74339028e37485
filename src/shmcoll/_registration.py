"""Registers the ``shm`` backend name with torch.distributed, once."""
from __future__ import annotations

import threading
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist

BACKEND_NAME = "shm"
_lock = threading.Lock()


def register_backend() -> bool:
    """Register ``shm`` (CPU) with torch.distributed; idempotent. False if unavailable."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    with _lock:
        if BACKEND_NAME.upper() in dist.Backend.backend_list or hasattr(dist.Backend, BACKEND_NAME.upper()):
            return True
        dist.Backend.register_backend(BACKEND_NAME, _create_process_group, devices=["cpu"])
    return True


def _create_process_group(store: dist.Store, rank: int, world_size: int, timeout: timedelta):
    # Imported here so registration never pays for NumPy, Numba or the extension.
    from shmcoll import torch_internals

    # What the group takes from torch's internals, checked by the first group of a process before it is built
    # (a torch that changed one fails here, naming it, not later inside torch).
    torch_internals.check(BACKEND_NAME, rank)
    from shmcoll.process_group import ProcessGroupShm

    return ProcessGroupShm(store, rank, world_size, timeout)
