"""shmcoll: a shared-memory torch.distributed backend for CPU tensors.

``import shmcoll`` (or just ``import torch``, through the entry point)
registers the backend named ``"shm"``::

    dist.init_process_group("shm")
"""
from shmcoll._registration import BACKEND_NAME, register_backend

__version__ = "0.1.0"
__all__ = ["BACKEND_NAME", "register_backend", "__version__"]

register_backend()
