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


def copy_strided(uintptr_t dst, Py_ssize_t dst_stride, uintptr_t src, Py_ssize_t src_stride,
                 size_t nbytes, Py_ssize_t count):
    """``count`` copies of ``nbytes``: block i goes from src + i*src_stride to dst + i*dst_stride."""
    cdef Py_ssize_t i
    with nogil:
        for i in range(count):
            memcpy(<void *>(dst + i * dst_stride), <const void *>(src + i * src_stride), nbytes)
