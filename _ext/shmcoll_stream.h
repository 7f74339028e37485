/* Copies into large user buffers with non-temporal (streaming) stores.
 *
 * A result written to a tensor far larger than the cache costs three memory
 * passes with ordinary stores (read the source, read the destination line for
 * ownership, write it back) and two with streaming stores, which skip the
 * read for ownership. That is the difference between an all-reduce running at
 * the memcpy ceiling and above it. Streaming stores are weakly ordered:
 * shmcoll_stream_fence() must run before anything signals that the data is
 * there (the end of the schedule, before control returns to Python).
 */
#ifndef SHMCOLL_STREAM_H
#define SHMCOLL_STREAM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>

static inline void shmcoll_copy_stream(void *dst, const void *src, size_t n) {
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (n < head + 64) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head);  /* up to the first 16-byte boundary of the destination */
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, n);
}

static inline void shmcoll_stream_fence(void) { _mm_sfence(); }

#else  /* other architectures: ordinary copies, nothing to fence */

static inline void shmcoll_copy_stream(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
static inline void shmcoll_stream_fence(void) {}

#endif
#endif
