# cython: language_level=3, boundscheck=False, wraparound=False
"""Memory for results the caller keeps, lent as tensors and taken back when torch frees them.

A sparse all_reduce returns its sum in new memory that the caller keeps (DDP
makes it the gradient) and drops a step later. Memory that malloc hands out
anew is often memory it gave back to the kernel since (glibc trims its heap
when a large block is freed at its top), and the first write to each of its
pages is a page fault: on the 2-core VM ~150-450 faults, 0.3-0.7 ms, in a
sparse all_reduce of 1 ms of work. A pool that takes the block back when the
caller is done with it lends the same, already mapped pages every step.

The block is lent through DLPack (``torch.from_dlpack``): torch calls the
capsule's deleter when the last tensor viewing the memory is freed, from
whichever thread frees it, and without the GIL. The deleter only flips the
block's state with one atomic operation, so it needs neither Python nor a lock
(a Python deleter would take the GIL wherever torch frees a gradient, at
interpreter exit too). States: FREE (in the pool), LENT (a tensor holds it),
ORPHANED (a tensor holds it and the pool is gone: the deleter frees it).
Exactly one side frees a block: the pool's end where it finds the block FREE,
the deleter where it finds it ORPHANED.

The tensor is torch's like any other, except that its storage cannot be
resized in place (``resize_`` of the storage raises); torch's sparse operations
give a sparse tensor new indices and values instead of resizing the old ones.
"""
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free

from arch cimport shmcoll_compare_exchange_u32, shmcoll_load_acquire_u32

cdef extern from "<stdlib.h>" nogil:
    int posix_memalign(void **memptr, size_t alignment, size_t size)

cdef enum:
    FREE = 0
    LENT = 1
    ORPHANED = 2
    MAX_BLOCKS = 8  # results alive at once that the pool serves (one per sparse gradient of a step)
    ALIGNMENT = 64  # the data's, as torch's own allocator aligns
    DL_CPU = 1  # DLPack's kDLCPU
    DL_UINT = 1  # DLPack's kDLUInt

# DLPack's ABI (dlpack.h, unversioned): what torch.from_dlpack reads from a "dltensor" capsule.
ctypedef struct DLDevice:
    int32_t device_type
    int32_t device_id

ctypedef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

ctypedef struct DLTensor:
    void *data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t *shape
    int64_t *strides
    uint64_t byte_offset

ctypedef struct DLManagedTensor:
    DLTensor dl_tensor
    void *manager_ctx
    void (*deleter)(DLManagedTensor *) noexcept nogil

ctypedef struct Block:
    DLManagedTensor managed  # what the capsule points to; manager_ctx is the block
    int64_t shape  # the lent length in bytes: a 1-D uint8 tensor
    int64_t stride
    size_t capacity  # bytes of data after the header
    uint32_t state

cdef size_t HEADER = (sizeof(Block) + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


cdef void _returned(DLManagedTensor *managed) noexcept nogil:
    """DLPack's deleter: torch freed the last tensor on the block."""
    cdef Block *block = <Block *>managed.manager_ctx
    if not shmcoll_compare_exchange_u32(&block.state, LENT, FREE):  # ORPHANED: the pool is gone
        free(block)


cdef void _capsule_dropped(object capsule) noexcept:
    """A capsule that torch never took still owns its block (DLPack's rule)."""
    cdef DLManagedTensor *managed
    if PyCapsule_IsValid(capsule, "dltensor"):  # torch renames the capsules it takes
        managed = <DLManagedTensor *>PyCapsule_GetPointer(capsule, "dltensor")
        managed.deleter(managed)


cdef class Pool:
    """At most ``MAX_BLOCKS`` blocks of at most ``limit`` bytes in all, lent or free."""

    cdef Block *blocks[MAX_BLOCKS]
    cdef size_t limit

    def __cinit__(self, size_t limit):
        cdef int i
        for i in range(MAX_BLOCKS):
            self.blocks[i] = NULL
        self.limit = limit

    def __dealloc__(self):
        cdef int i
        for i in range(MAX_BLOCKS):
            if self.blocks[i] != NULL and not shmcoll_compare_exchange_u32(&self.blocks[i].state, LENT, ORPHANED):
                free(self.blocks[i])  # FREE: nobody else holds it
            self.blocks[i] = NULL

    def lend(self, size_t nbytes):
        """A DLPack capsule of ``nbytes`` bytes (a 1-D uint8 tensor once given to ``torch.from_dlpack``),
        or None where the pool has no room left: the caller allocates as usual."""
        cdef Block *block = self._claim(nbytes)
        if block == NULL:
            return None
        block.shape = nbytes
        block.stride = 1
        block.managed.dl_tensor.data = <char *>block + HEADER
        block.managed.dl_tensor.device.device_type = DL_CPU
        block.managed.dl_tensor.device.device_id = 0
        block.managed.dl_tensor.ndim = 1
        block.managed.dl_tensor.dtype.code = DL_UINT
        block.managed.dl_tensor.dtype.bits = 8
        block.managed.dl_tensor.dtype.lanes = 1
        block.managed.dl_tensor.shape = &block.shape
        block.managed.dl_tensor.strides = &block.stride
        block.managed.dl_tensor.byte_offset = 0
        block.managed.manager_ctx = block
        block.managed.deleter = _returned
        return PyCapsule_New(&block.managed, "dltensor", _capsule_dropped)

    cdef Block *_claim(self, size_t nbytes):
        """The smallest free block that holds ``nbytes``, or a new one where the limit allows
        (free blocks too small are dropped to make room), LENT; NULL if none."""
        cdef int i, best = -1, empty = -1
        cdef size_t kept = 0, capacity
        cdef Block *block
        for i in range(MAX_BLOCKS):
            block = self.blocks[i]
            if block == NULL:
                continue
            if shmcoll_load_acquire_u32(&block.state) == FREE and block.capacity >= nbytes and \
                    (best < 0 or block.capacity < self.blocks[best].capacity):
                best = i
        if best >= 0 and shmcoll_compare_exchange_u32(&self.blocks[best].state, FREE, LENT):
            return self.blocks[best]
        capacity = nbytes + nbytes // 4  # room for the next, slightly larger result
        if capacity > self.limit:
            return NULL
        for i in range(MAX_BLOCKS):  # drop the free blocks (all too small), count the lent ones
            block = self.blocks[i]
            if block != NULL and shmcoll_compare_exchange_u32(&block.state, FREE, LENT):
                free(block)
                self.blocks[i] = block = NULL
            if block == NULL:
                empty = i
            else:
                kept += block.capacity
        if empty < 0 or kept + capacity > self.limit:
            return NULL
        if posix_memalign(<void **>&block, ALIGNMENT, HEADER + capacity) != 0:
            return NULL
        block.capacity = capacity
        block.state = LENT
        self.blocks[empty] = block
        return block
