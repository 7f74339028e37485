# cython: language_level=3, boundscheck=False, wraparound=False
"""Bulk copies between user tensors and the arena with the GIL released."""
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy


def copy(uintptr_t dst, uintptr_t src, size_t nbytes):
    """memcpy(dst, src, nbytes); the ranges must not overlap."""
    if nbytes < 65536:
        # Releasing the GIL costs more than a small copy.
        memcpy(<void *>dst, <const void *>src, nbytes)
    else:
        with nogil:
            memcpy(<void *>dst, <const void *>src, nbytes)

