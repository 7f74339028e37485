"""The ``torch.backends`` entry point: runs at the end of ``import torch``.

It must stay cheap and must never raise, because an exception here breaks
``import torch`` for the user. It only registers the backend name; NumPy,
Numba and the extension modules load later, inside the backend's creator.
"""


def register() -> None:
    """Register the ``shm`` backend with torch.distributed, if that is possible."""
    try:
        from shmcoll._registration import register_backend

        register_backend()
    except Exception as error:  # never break `import torch`
        import warnings

        warnings.warn(f"shmcoll: could not register the 'shm' backend: {error!r}", stacklevel=2)
