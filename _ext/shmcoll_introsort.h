/* torch's CPU sort of int64 keys (torch.sort(stable=False)), step for step, for the sparse coalesce.

   Why: a coalesce sums a rank's equal indices in the order torch's sort leaves them, and that sort
   is not stable, so the order of three or more equal indices (and so the sum's last bits) is
   whatever its algorithm makes of the input. Torch sorts (key, position) pairs below 32768 keys
   with libstdc++'s std::sort (an introsort: median-of-three quicksort to runs of 16, a heapsort
   past 2 log2(n) levels, one insertion sort at the end) through a strided key-value iterator;
   this is that algorithm, every comparison and move in its order, on an array of pairs: same
   input, same permutation. What makes it faster is the partition (below): 8192 skewed keys took
   0.25 ms with torch's sort, 0.10 ms here, on the 2-core VM.

   libstdc++'s bits/stl_algo.h and bits/stl_heap.h have kept this algorithm since GCC 4.9; the
   caller checks once per process that torch's sort agrees (shmcoll.sparse._sorts_as_torch) and
   keeps torch's own sort where it does not. */
#ifndef SHMCOLL_INTROSORT_H
#define SHMCOLL_INTROSORT_H

#include <stdint.h>
#include <stddef.h>

typedef struct {
    int64_t key;
    int64_t pos;
} shmcoll_keyed;

enum { SHMCOLL_INTROSORT_THRESHOLD = 16 };  /* libstdc++'s _S_threshold */

static inline void shmcoll_keyed_swap(shmcoll_keyed *a, shmcoll_keyed *b) {
    shmcoll_keyed t = *a;
    *a = *b;
    *b = t;
}

/* std::__push_heap */
static inline void shmcoll_push_heap(shmcoll_keyed *first, ptrdiff_t hole, ptrdiff_t top, shmcoll_keyed value) {
    ptrdiff_t parent = (hole - 1) / 2;
    while (hole > top && first[parent].key < value.key) {
        first[hole] = first[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    first[hole] = value;
}

/* std::__adjust_heap */
static inline void shmcoll_adjust_heap(shmcoll_keyed *first, ptrdiff_t hole, ptrdiff_t len, shmcoll_keyed value) {
    const ptrdiff_t top = hole;
    ptrdiff_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (first[child].key < first[child - 1].key)
            child--;
        first[hole] = first[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        first[hole] = first[child - 1];
        hole = child - 1;
    }
    shmcoll_push_heap(first, hole, top, value);
}

/* std::__partial_sort(first, last, last): __make_heap, then __sort_heap (the heap select takes nothing
   more when the middle is the end). */
static inline void shmcoll_heapsort(shmcoll_keyed *first, shmcoll_keyed *last) {
    ptrdiff_t len = last - first;
    if (len >= 2) {
        ptrdiff_t parent = (len - 2) / 2;
        while (1) {
            shmcoll_adjust_heap(first, parent, len, first[parent]);
            if (parent == 0)
                break;
            parent--;
        }
    }
    while (last - first > 1) {  /* __pop_heap(first, last, last) */
        --last;
        shmcoll_keyed value = *last;
        *last = *first;
        shmcoll_adjust_heap(first, 0, last - first, value);
    }
}

/* std::__move_median_to_first */
static inline void shmcoll_median_to_first(shmcoll_keyed *result, shmcoll_keyed *a, shmcoll_keyed *b,
                                           shmcoll_keyed *c) {
    if (a->key < b->key) {
        if (b->key < c->key)
            shmcoll_keyed_swap(result, b);
        else if (a->key < c->key)
            shmcoll_keyed_swap(result, c);
        else
            shmcoll_keyed_swap(result, a);
    } else if (a->key < c->key)
        shmcoll_keyed_swap(result, a);
    else if (b->key < c->key)
        shmcoll_keyed_swap(result, c);
    else
        shmcoll_keyed_swap(result, b);
}

/* std::__unguarded_partition_pivot. The partition is Hoare's: the t-th element from the left that is
   not below the pivot swaps with the t-th from the right that is not above it, while the first lies
   left of the second. Its loops branch on every comparison, and the branches are random: finding the
   candidates a block of BLOCK elements at a time, without a branch (BlockQuicksort, Edelkamp & Weiss
   2016), then making the very same swaps in the same order, gives the same array at about half the
   cost. Each block is read before any swap reaches it (the left blocks lie left of every right one),
   so the candidates are those Hoare's loops meet; the last stretch, under two blocks, runs Hoare's
   loops from the state the blocks leave, which is a state those loops pass through. */
enum { SHMCOLL_INTROSORT_BLOCK = 64 };

static inline shmcoll_keyed *shmcoll_partition_pivot(shmcoll_keyed *first, shmcoll_keyed *last) {
    enum { BLOCK = SHMCOLL_INTROSORT_BLOCK };
    shmcoll_keyed *mid = first + (last - first) / 2;
    shmcoll_median_to_first(first, first + 1, mid, last - 1);
    const int64_t pivot = first->key;  /* *first stays put during the partition */
    /* Unread: [left, right]. Candidates found but not swapped yet: left_at[left_next..left_count) as
       offsets from left_base (all left of `left`), right_at[...] as offsets down from right_base. */
    shmcoll_keyed *left = first + 1, *right = last - 1, *left_base = left, *right_base = right;
    unsigned char left_at[BLOCK], right_at[BLOCK];
    int left_next = 0, left_count = 0, right_next = 0, right_count = 0;
    for (;;) {
        ptrdiff_t unread = right - left + 1;
        int need_left = left_next == left_count, need_right = right_next == right_count;
        if (unread < (need_left + need_right) * (ptrdiff_t)BLOCK || (!need_left && !need_right))
            break;
        if (need_left) {
            left_base = left;
            left_next = left_count = 0;
            for (int i = 0; i < BLOCK; i++) {
                left_at[left_count] = (unsigned char)i;
                left_count += !(left[i].key < pivot);
            }
            left += BLOCK;
        }
        if (need_right) {
            right_base = right;
            right_next = right_count = 0;
            for (int i = 0; i < BLOCK; i++) {
                right_at[right_count] = (unsigned char)i;
                right_count += !(pivot < (right - i)->key);
            }
            right -= BLOCK;
        }
        int pairs = left_count - left_next < right_count - right_next ? left_count - left_next
                                                                       : right_count - right_next;
        for (int t = 0; t < pairs; t++)
            shmcoll_keyed_swap(left_base + left_at[left_next + t], right_base - right_at[right_next + t]);
        left_next += pairs;
        right_next += pairs;
    }
    /* Hoare's loops, from where the blocks stopped: lo at the next unswapped candidate (or the first
       unread element), hi one past the next candidate from the right (or past the last unread). */
    shmcoll_keyed *lo = left_next < left_count ? left_base + left_at[left_next] : left;
    shmcoll_keyed *hi = right_next < right_count ? right_base - right_at[right_next] + 1 : right + 1;
    while (1) {
        while (lo->key < pivot)
            ++lo;
        --hi;
        while (pivot < hi->key)
            --hi;
        if (!(lo < hi))
            return lo;
        shmcoll_keyed_swap(lo, hi);
        ++lo;
    }
}

/* std::__introsort_loop */
static void shmcoll_introsort_loop(shmcoll_keyed *first, shmcoll_keyed *last, int depth_limit) {
    while (last - first > SHMCOLL_INTROSORT_THRESHOLD) {
        if (depth_limit == 0) {
            shmcoll_heapsort(first, last);
            return;
        }
        --depth_limit;
        shmcoll_keyed *cut = shmcoll_partition_pivot(first, last);
        shmcoll_introsort_loop(cut, last, depth_limit);
        last = cut;
    }
}

/* std::__unguarded_linear_insert */
static inline void shmcoll_linear_insert(shmcoll_keyed *last) {
    shmcoll_keyed value = *last;
    shmcoll_keyed *next = last - 1;
    while (value.key < next->key) {
        *last = *next;
        last = next;
        --next;
    }
    *last = value;
}

/* std::__insertion_sort */
static inline void shmcoll_insertion_sort(shmcoll_keyed *first, shmcoll_keyed *last) {
    if (first == last)
        return;
    for (shmcoll_keyed *i = first + 1; i != last; ++i) {
        if (i->key < first->key) {
            shmcoll_keyed value = *i;
            for (shmcoll_keyed *p = i; p != first; --p)  /* move_backward(first, i, i + 1) */
                *p = *(p - 1);
            *first = value;
        } else
            shmcoll_linear_insert(i);
    }
}

/* std::sort(first, first + n), ascending by key */
static inline void shmcoll_introsort(shmcoll_keyed *first, ptrdiff_t n) {
    if (n <= 0)
        return;
    int lg = 63 - __builtin_clzll((unsigned long long)n);  /* std::__lg */
    shmcoll_introsort_loop(first, first + n, 2 * lg);
    /* std::__final_insertion_sort */
    if (n > SHMCOLL_INTROSORT_THRESHOLD) {
        shmcoll_insertion_sort(first, first + SHMCOLL_INTROSORT_THRESHOLD);
        for (shmcoll_keyed *i = first + SHMCOLL_INTROSORT_THRESHOLD; i != first + n; ++i)
            shmcoll_linear_insert(i);  /* __unguarded_insertion_sort */
    } else
        shmcoll_insertion_sort(first, first + n);
}

#endif
