/* Process-shared synchronisation primitives (and a prefetch hint) for shmcoll's Cython layer.
 *
 * Control words live in a MAP_SHARED segment, so every access that another
 * process may observe is an explicit __atomic operation; the futex calls use
 * the shared (not PRIVATE) variants because the waiters are other processes.
 */
#ifndef SHMCOLL_ARCH_H
#define SHMCOLL_ARCH_H

#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sched.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

static inline void shmcoll_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

static inline uint32_t shmcoll_load_acquire_u32(const uint32_t *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline uint64_t shmcoll_load_acquire_u64(const uint64_t *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline void shmcoll_store_release_u32(uint32_t *p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline void shmcoll_store_release_u64(uint64_t *p, uint64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
/* Sequentially consistent pair used by the sleep/wake handshake: the poster
 * stores the word then reads the waiter count, the waiter bumps the count then
 * re-reads the word; seq_cst on both sides forbids the store->load reordering
 * that would lose a wake-up. */
static inline void shmcoll_store_seq_cst_u32(uint32_t *p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}
static inline uint32_t shmcoll_load_seq_cst_u32(const uint32_t *p) {
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}
static inline uint32_t shmcoll_fetch_add_u32(uint32_t *p, uint32_t v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
static inline uint32_t shmcoll_fetch_sub_u32(uint32_t *p, uint32_t v) {
    return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST);
}
/* 1 and *p = desired where *p held expected, else 0 (and *p unchanged). */
static inline int shmcoll_compare_exchange_u32(uint32_t *p, uint32_t expected, uint32_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static inline int64_t shmcoll_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Sleeps while *addr == expected, for at most timeout_ns. Spurious returns are
 * fine: callers always re-check their condition. */
static inline void shmcoll_futex_wait(uint32_t *addr, uint32_t expected, int64_t timeout_ns) {
    struct timespec ts;
    ts.tv_sec = timeout_ns / 1000000000LL;
    ts.tv_nsec = timeout_ns % 1000000000LL;
    syscall(SYS_futex, addr, FUTEX_WAIT, expected, &ts, NULL, 0);
}
static inline void shmcoll_futex_wake_all(uint32_t *addr) {
    syscall(SYS_futex, addr, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

/* A hint that *p will be read soon (into every cache level): for reads in an
 * order the hardware prefetcher cannot guess, such as rows taken along a
 * permutation. */
static inline void shmcoll_prefetch(const void *p) {
    __builtin_prefetch(p, 0, 3);
}

/* memcpy(dst, src, n) with stores that do not read the destination's lines first nor keep them in the caches
 * (non-temporal): for an output that will not stay in cache anyway, where an ordinary store reads every line
 * before writing it and so moves three bytes of memory traffic per byte copied instead of two (the 2-core VM:
 * 64 MiB copied 1.5x as fast, two copies at once 1.8x). Where the CPU has no such stores, memcpy. */
static inline void shmcoll_copy_streaming(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (n < head + 64) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; d += 64, s += 64, n -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, n);
    _mm_sfence();  /* ordered before the step that tells the peers (or the caller) the data is there */
#else
    memcpy(dst, src, n);
#endif
}

/* The CPU the calling thread runs on (glibc reads it from rseq where the kernel offers it, else from
 * the vDSO or a system call; only waits where ranks outnumber the cores ask). */
static inline uint32_t shmcoll_cpu(void) {
    return (uint32_t)sched_getcpu();
}

/* Sequence numbers are 32-bit and wrap; "a has reached b" is a signed
 * distance test, valid while the two are less than 2**31 steps apart. */
static inline int shmcoll_reached(uint32_t a, uint32_t b) {
    return (int32_t)(a - b) >= 0;
}

#endif
