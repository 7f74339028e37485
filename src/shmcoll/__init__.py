"""shmcoll: a shared-memory torch.distributed backend for CPU tensors.

``import shmcoll`` (or just ``import torch``, through the entry point)
registers the backend named ``"shm"``::

    dist.init_process_group("shm")

The exceptions it raises on purpose are importable from here, so callers
can tell a dead peer from a timeout from mismatched collectives.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shmcoll._registration import BACKEND_NAME, register_backend
from shmcoll.errors import (CollectiveError, PeerDiedError, PeerGaveUpError, PeerLeftError, PeerTimeoutError,
                            ShmcollError)

if TYPE_CHECKING:
    from shmcoll.process_group import ProcessGroupShm

__version__ = "0.1.0"
__all__ = ["BACKEND_NAME", "CollectiveError", "PeerDiedError", "PeerGaveUpError", "PeerLeftError",
           "PeerTimeoutError", "ProcessGroupShm", "ShmcollError", "register_backend", "__version__"]

register_backend()


def __getattr__(name: str) -> Any:
    """``shmcoll.ProcessGroupShm`` on first use: importing it loads NumPy, Numba and the extension.

    It is the class the "shm" creator returns: a ProcessGroup subclass (``shmcoll.process_group``).
    """
    if name == "ProcessGroupShm":
        from shmcoll.process_group import ProcessGroupShm

        return ProcessGroupShm
    raise AttributeError(f"module 'shmcoll' has no attribute {name!r}")
