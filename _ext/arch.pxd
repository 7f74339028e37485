# Declarations of shmcoll_arch.h: atomics, pause, futex, clock and prefetch helpers, and the streaming copy.
from libc.stdint cimport uint32_t, uint64_t, int64_t

cdef extern from "shmcoll_arch.h" nogil:
    void shmcoll_cpu_relax()
    uint32_t shmcoll_load_acquire_u32(const uint32_t *p)
    uint64_t shmcoll_load_acquire_u64(const uint64_t *p)
    void shmcoll_store_release_u32(uint32_t *p, uint32_t v)
    void shmcoll_store_release_u64(uint64_t *p, uint64_t v)
    void shmcoll_store_seq_cst_u32(uint32_t *p, uint32_t v)
    uint32_t shmcoll_load_seq_cst_u32(const uint32_t *p)
    uint32_t shmcoll_fetch_add_u32(uint32_t *p, uint32_t v)
    uint32_t shmcoll_fetch_sub_u32(uint32_t *p, uint32_t v)
    int shmcoll_compare_exchange_u32(uint32_t *p, uint32_t expected, uint32_t desired)
    int64_t shmcoll_now_ns()
    void shmcoll_futex_wait(uint32_t *addr, uint32_t expected, int64_t timeout_ns)
    void shmcoll_futex_wake_all(uint32_t *addr)
    int shmcoll_reached(uint32_t a, uint32_t b)
    void shmcoll_prefetch(const void *p)
    uint32_t shmcoll_cpu()
    void shmcoll_copy_streaming(void *dst, const void *src, size_t n)
