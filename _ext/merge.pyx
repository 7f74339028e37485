# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The two sums of a sparse all_reduce, in C: a rank's own duplicates (``coalesce``) and the ranks' parts
(``merge``), each in the order torch and Gloo add them, so the result is Gloo's bit for bit.

``coalesce`` is torch's ``coalesce()`` given torch's sort of the flattened
indices (``sort`` repeats it: shmcoll_introsort.h): walking that permutation,
the first row of each index is copied and the later ones added one by one
(torch's ``_coalesce_sparse_cpu`` does exactly that, with ``axpy``). Doing it
here writes the rows straight into the buffer the all-gather sends from, with
no new tensor per call.

Every rank's part arrives sorted by index (row-major order of the index
tuples, as ``coalesce()`` leaves it) and without duplicates, so the sum is a
k-way merge: take the smallest index at the ranks' heads, copy the value row of
the lowest rank that has it, and add the rows of the higher ranks that have it
too, in rank order. That is Gloo's result bit for bit: Gloo adds the ranks'
sparse tensors one by one in rank order, each addition rounded, so an element
of the sum is ((rank 0 + rank 1) + rank 2) + ... (concatenating the parts and
coalescing once would not be: torch's coalesce does not keep equal indices in
rank order; ``shmcoll.sparse``). Adding row by row, each addition rounded to the
value dtype, is what calling the reduction kernel once per added row does
(``n`` elements, one row).

The merge is two passes. ``plan`` walks the indices alone, comparing them,
and writes down the order: for every row of the parts, whether it starts a
row of the sum or is added to the one before. That counts the rows of the sum,
so its tensors are allocated at their exact size (they become the caller's
tensor's own: no copy after the merge). ``Merge`` then follows the steps
without comparing anything, so the comparisons' mispredicted branches (which
part holds the smaller index is random) are paid in one pass, not two; it
takes the value rows a window at a time, as the all-gather's steps bring them
into shared memory (one window where every row is at hand). Two
parts of one sparse dimension, the common case (2 ranks, an embedding), are
planned without such a branch (``_plan_two``), and so are more parts of one
sparse dimension (``_plan_packed``: a tree of such two-way merges over rows
packed with their rank). For two parts of ~7700 rows of 64 floats on the
2-core VM (hot caches) counting takes 0.045 ms, against 0.12 ms with a branch
per row, and merging 0.09 ms, against 0.18 ms comparing as it goes; four
parts: planning 0.19 ms, against 0.46 ms with the general merge.

Torch's way sorts the concatenation (n log n, then a gather of every row);
this reads each row once and is most of the speed of shm's sparse all_reduce.

Both add by calling the reduction kernel once per added row (``n`` elements, one
row): one rounding to the value dtype per addition, as torch's additions round.
"""
from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

from arch cimport shmcoll_prefetch

cdef extern from "shmcoll_introsort.h" nogil:
    ctypedef struct shmcoll_keyed:
        int64_t key
        int64_t pos
    void shmcoll_introsort(shmcoll_keyed *first, Py_ssize_t n)

# torch sorts fewer int64 keys than this with std::sort, which sort() repeats; this many or more with
# fbgemm's radix sort where torch has it (at::internal::GRAIN_SIZE), which is stable.
SORTS_AS_TORCH_BELOW = 32768

# The permutation takes the rows in an order no hardware prefetcher follows, and a gradient that was
# written a while ago (or on another core) is out of this core's caches: each row is asked for this many
# rows ahead, at most PREFETCH_BYTES of it (the hardware follows a longer row's lines itself). On the
# 2-core VM this took the pass over a cold 8192 x 256 B gradient from 0.37 to 0.15 ms.
cdef enum:
    PREFETCH_AHEAD = 16
    PREFETCH_BYTES = 512

from schedule cimport kernel_t


cdef inline int _compare(const int64_t *a, const int64_t *b, int dims) noexcept nogil:
    """-1, 0 or 1 as index tuple ``a`` sorts before, with or after ``b``."""
    cdef int d
    for d in range(dims):
        if a[d] != b[d]:
            return -1 if a[d] < b[d] else 1
    return 0


cdef Py_ssize_t _plan(const int64_t *idx, const int64_t *count, int size, Py_ssize_t most, int dims,
                      int32_t *steps, Py_ssize_t *head) noexcept nogil:
    """The k-way merge over the indices alone, written as ``steps`` (see ``plan``); the rows of the sum."""
    cdef Py_ssize_t o = 0, s = 0, row_stride = most * dims
    cdef int r, best
    cdef const int64_t *smallest
    cdef const int64_t *candidate
    while True:
        best = -1
        smallest = NULL
        for r in range(size):
            if head[r] < count[r]:
                candidate = idx + r * row_stride + head[r] * dims
                if best < 0 or _compare(candidate, smallest, dims) < 0:
                    best, smallest = r, candidate
        if best < 0:
            return o
        steps[s] = best
        s += 1
        head[best] += 1
        # Lower ranks cannot hold this index: one of them would have been ``best``.
        for r in range(best + 1, size):
            if head[r] < count[r] and _compare(idx + r * row_stride + head[r] * dims, smallest, dims) == 0:
                steps[s] = -1 - r
                s += 1
                head[r] += 1
        o += 1


cdef Py_ssize_t _plan_two(const int64_t *a, Py_ssize_t na, const int64_t *b, Py_ssize_t nb,
                          int32_t *steps) noexcept nogil:
    """``_plan`` for two parts of one sparse dimension (2 ranks, an embedding's gradient), written without a
    branch that depends on the indices: which part holds the smaller is random, so a branch on it is
    mispredicted every other row. The same steps as ``_plan``'s."""
    cdef Py_ssize_t i = 0, j = 0, s = 0, o = 0
    cdef int64_t x, y
    while i < na and j < nb:  # two rows or more remain, so steps[s + 1] is in bounds
        x = a[i]
        y = b[j]
        steps[s] = x > y  # rank 1 starts the row where its index is the smaller, rank 0 otherwise
        steps[s + 1] = -2  # rank 1 added to rank 0's row: kept only where the indices are equal
        s += 1 + (x == y)
        i += x <= y
        j += y <= x
        o += 1
    while i < na:
        steps[s] = 0
        s += 1
        i += 1
        o += 1
    while j < nb:
        steps[s] = 1
        s += 1
        j += 1
        o += 1
    return o


cdef bint _packable(const int64_t *idx, const int64_t *count, int size, Py_ssize_t most, int bits) noexcept nogil:
    """Whether every index of the parts (one sparse dimension, each part sorted) is in [0, 2^(63 - bits)),
    so that (index << bits | rank) is an int64 that orders by index, then rank."""
    cdef int r
    for r in range(size):
        if count[r] > 0 and (idx[r * most] < 0 or idx[r * most + count[r] - 1] >> (63 - bits) != 0):
            return False
    return True


cdef void _merge_two_runs(const int64_t *a, Py_ssize_t na, const int64_t *b, Py_ssize_t nb,
                          int64_t *out) noexcept nogil:
    """Two sorted runs of distinct values into one, without a branch on which holds the smaller."""
    cdef Py_ssize_t i = 0, j = 0, o = 0
    cdef int64_t x, y
    cdef bint from_b
    while i < na and j < nb:
        x = a[i]
        y = b[j]
        from_b = y < x
        out[o] = y if from_b else x
        o += 1
        i += 1 - from_b
        j += from_b
    while i < na:
        out[o] = a[i]
        o += 1
        i += 1
    while j < nb:
        out[o] = b[j]
        o += 1
        j += 1


cdef Py_ssize_t _plan_packed(const int64_t *idx, const int64_t *count, int size, Py_ssize_t most, int bits,
                             int32_t *steps, int64_t *scratch, Py_ssize_t *starts) noexcept nogil:
    """``_plan`` for three parts or more of one sparse dimension, the indices ``_packable``: each row packed
    as (index << bits | rank), the parts merged pairwise (a tree: log2(size) passes over the rows, each
    without a branch on the indices), then read off: a new index starts a row of the sum, a repeated one
    (the next rank's, as the packing orders them) is added to it. The same steps as ``_plan``'s; 4 parts
    of ~7700 rows: 0.28 ms scanning every part's head for each row of the sum, 0.19 ms this way.
    ``scratch``: room for twice the parts' rows; ``starts``: for ``size + 1`` offsets (where each run
    starts)."""
    cdef Py_ssize_t total = 0, start, s, o = 0, i
    cdef int64_t *runs = scratch
    cdef int64_t *merged
    cdef int64_t *swap
    cdef int64_t key, previous = -1, mask = (<int64_t>1 << bits) - 1
    cdef int r, n_runs, t
    for r in range(size):
        starts[r] = total
        for i in range(count[r]):
            runs[total + i] = idx[r * most + i] << bits | r
        total += count[r]
    starts[size] = total
    merged = scratch + total
    n_runs = size
    while n_runs > 1:
        t = 0
        for r in range(0, n_runs - 1, 2):
            _merge_two_runs(runs + starts[r], starts[r + 1] - starts[r], runs + starts[r + 1],
                            starts[r + 2] - starts[r + 1], merged + starts[r])
            starts[t] = starts[r]
            t += 1
        if n_runs % 2:  # the odd run out waits for the next pass
            start = starts[n_runs - 1]
            for i in range(start, total):
                merged[i] = runs[i]
            starts[t] = start
            t += 1
        starts[t] = total
        n_runs = t
        swap = runs
        runs = merged
        merged = swap
    for s in range(total):
        key = runs[s] >> bits
        r = <int>(runs[s] & mask)
        steps[s] = r if key != previous else ~r  # r where it starts a row, -1 - r (= ~r) where it is added
        o += key != previous
        previous = key
    return o


ctypedef struct Follow:
    const int32_t *steps
    Py_ssize_t total
    Py_ssize_t s  # the next step
    Py_ssize_t o  # the row of the sum written last (-1: none yet)
    const int64_t *idx  # the parts' indices, [size, most, dims]
    const int64_t *count
    int size
    int dims
    Py_ssize_t most
    Py_ssize_t row_elems
    Py_ssize_t row_bytes
    int64_t *out_idx
    char *out_val
    Py_ssize_t nnz
    char *stash  # [size, most] rows: the rows of a window that its steps had not reached yet
    kernel_t add
    int64_t sum_op
    Py_ssize_t *head  # each part's next row
    char *sum_row


cdef int _follow(Follow *f, Py_ssize_t first, Py_ssize_t end, const uintptr_t *window) noexcept nogil:
    """Follow the steps as far as the rows they take have arrived: part r's rows [first, end) at
    ``window[r]``, its earlier rows in the stash. 0 where it stopped at a row yet to come (or at the
    end), -1 where the steps do not fit the parts and ``nnz`` (nothing is written out of bounds)."""
    cdef int32_t step
    cdef int r, d
    cdef Py_ssize_t x
    cdef const char *row
    while f.s < f.total:
        step = f.steps[f.s]
        r = step if step >= 0 else -1 - step
        if r >= f.size or f.head[r] >= f.count[r] or (step < 0 and f.o < 0):
            return -1
        x = f.head[r]
        if x >= end:
            return 0
        if x >= first:
            row = <const char *>window[r] + (x - first) * f.row_bytes
        else:
            row = f.stash + (r * f.most + x) * f.row_bytes
        f.head[r] = x + 1
        f.s += 1
        if step >= 0:
            f.o += 1
            if f.o >= f.nnz:
                return -1
            for d in range(f.dims):
                f.out_idx[d * f.nnz + f.o] = f.idx[(r * f.most + x) * f.dims + d]
            f.sum_row = f.out_val + f.o * f.row_bytes
            memcpy(f.sum_row, row, f.row_bytes)
        elif f.row_elems > 0:
            f.add(f.sum_row, f.sum_row, <void *>row, 1, f.row_elems, f.row_elems, f.sum_op, 1.0)
    return 0


cdef void _stash(Follow *f, Py_ssize_t first, Py_ssize_t end, const uintptr_t *window) noexcept nogil:
    """Keep the rows of a window that the steps have not taken yet: the window is about to go."""
    cdef int r
    cdef Py_ssize_t lo, hi
    for r in range(f.size):
        lo = f.head[r] if f.head[r] > first else first
        hi = end if end < f.count[r] else f.count[r]
        if hi > lo:
            memcpy(f.stash + (r * f.most + lo) * f.row_bytes, <const char *>window[r] + (lo - first) * f.row_bytes,
                   (hi - lo) * f.row_bytes)


cdef class Merge:
    """``plan``'s steps followed as the parts' value rows arrive, one window of rows at a time (the
    all-gather's steps through shared memory), into the sum: ``window`` as each arrives, ``finish``.

    Part r's rows of a window are read where they arrived, in place; the few that the steps do not
    reach within the window (their turn comes after rows of other parts that arrive later) are copied
    to the stash before the window goes. So the parts need not be copied out of shared memory first.
    The additions are the steps', in their order: the sum does not depend on the windows.
    """

    cdef Follow f
    cdef uintptr_t *arrived  # this window's address of each part

    def __cinit__(self, uintptr_t steps, Py_ssize_t total, uintptr_t indices, uintptr_t counts, int size,
                  Py_ssize_t most, int dims, Py_ssize_t row_elems, Py_ssize_t row_bytes, uintptr_t out_indices,
                  uintptr_t out_values, Py_ssize_t nnz, uintptr_t kernel, int64_t sum_op, uintptr_t stash):
        if nnz < 0:
            raise ValueError(f"sparse all_reduce: a sum of {nnz} rows")
        self.f.head = _heads(size)
        self.arrived = <uintptr_t *>calloc(size if size > 0 else 1, sizeof(uintptr_t))
        if self.arrived == NULL:
            raise MemoryError("sparse all_reduce: no memory for the merge's windows")
        self.f.steps = <const int32_t *>steps
        self.f.total = total
        self.f.s = 0
        self.f.o = -1
        self.f.idx = <const int64_t *>indices
        self.f.count = <const int64_t *>counts
        self.f.size = size
        self.f.dims = dims
        self.f.most = most
        self.f.row_elems = row_elems
        self.f.row_bytes = row_bytes
        self.f.out_idx = <int64_t *>out_indices
        self.f.out_val = <char *>out_values
        self.f.nnz = nnz
        self.f.stash = <char *>stash
        self.f.add = <kernel_t>kernel
        self.f.sum_op = sum_op
        self.f.sum_row = NULL

    def __dealloc__(self):
        free(self.f.head)
        free(self.arrived)

    def window(self, Py_ssize_t first, Py_ssize_t end, addresses):
        """Rows [first, end) of every part have arrived, part r's at ``addresses[r]``, readable until this
        returns. Windows come in order, each starting where the one before ended."""
        cdef int r, failed
        for r in range(self.f.size):
            self.arrived[r] = addresses[r]
        with nogil:
            failed = _follow(&self.f, first, end, self.arrived)
            if not failed:
                _stash(&self.f, first, end, self.arrived)
        if failed:
            self._refuse()

    def finish(self):
        """The rows of the sum, once every window came; raises where the steps were not all followed."""
        if self.f.s != self.f.total or self.f.o + 1 != self.f.nnz:
            self._refuse()
        return self.f.nnz

    def _refuse(self):
        # Cannot happen: the steps are plan's for these parts, unchanged since.
        raise ValueError(f"sparse all_reduce: the merge's {self.f.total} steps do not make the {self.f.nnz} "
                         f"rows planned from {self.f.size} parts")


cdef Py_ssize_t *_heads(int size) except NULL:
    cdef Py_ssize_t *head = <Py_ssize_t *>calloc(size if size > 0 else 1, sizeof(Py_ssize_t))
    if head == NULL:
        raise MemoryError("sparse all_reduce: no memory for the merge's heads")
    return head


def plan(uintptr_t indices, uintptr_t counts, int size, Py_ssize_t most, int dims, uintptr_t steps,
         uintptr_t scratch):
    """Merge the parts' indices; return the number of rows of their sum.

    ``indices``: int64 [size, most, dims], rank r's first ``counts[r]`` rows valid, each
    part sorted and without duplicates; ``counts``: int64 [size]. Writes one int32 to
    ``steps`` per row of the parts (``sum(counts)``), in the order the sum takes them:
    ``r`` where rank r's next row starts a row of the sum, ``-1 - r`` where it is added
    to the row before. ``scratch``: room for twice as many int64.
    """
    cdef Py_ssize_t *head
    cdef Py_ssize_t rows
    cdef const int64_t *idx = <const int64_t *>indices
    cdef const int64_t *count = <const int64_t *>counts
    cdef int bits = (size - 1).bit_length()
    if size == 2 and dims == 1:  # the two heads are _plan_two's locals
        with nogil:
            rows = _plan_two(idx, count[0], idx + most, count[1], <int32_t *>steps)
        return rows
    head = _heads(size + 1)
    with nogil:
        if size > 2 and dims == 1 and _packable(idx, count, size, most, bits):
            rows = _plan_packed(idx, count, size, most, bits, <int32_t *>steps, <int64_t *>scratch, head)
        else:
            rows = _plan(idx, count, size, most, dims, <int32_t *>steps, head)
    free(head)
    return rows


def sort(uintptr_t keys, Py_ssize_t n, uintptr_t pairs, uintptr_t sorted_keys, uintptr_t permutation):
    """``torch.sort(keys, 0)`` of ``n`` int64 keys, fewer than SORTS_AS_TORCH_BELOW: the same sorted keys
    and the same permutation, equal keys included (see shmcoll_introsort.h), about 2.5x faster.

    ``pairs``: room for ``n`` (key, position) pairs of int64; ``sorted_keys``, ``permutation``: int64 [n].
    """
    cdef const int64_t *key = <const int64_t *>keys
    cdef shmcoll_keyed *pair = <shmcoll_keyed *>pairs
    cdef int64_t *out_key = <int64_t *>sorted_keys
    cdef int64_t *out_pos = <int64_t *>permutation
    cdef Py_ssize_t i
    if n >= SORTS_AS_TORCH_BELOW:
        raise ValueError(f"sort: torch sorts {n} keys with another algorithm (at most {SORTS_AS_TORCH_BELOW - 1})")
    with nogil:
        for i in range(n):
            pair[i].key = key[i]
            pair[i].pos = i
        shmcoll_introsort(pair, n)
        for i in range(n):
            out_key[i] = pair[i].key
            out_pos[i] = pair[i].pos


def coalesce(uintptr_t sorted_keys, uintptr_t permutation, Py_ssize_t nnz, uintptr_t indices, int dims,
             uintptr_t values, Py_ssize_t row_elems, Py_ssize_t row_bytes, uintptr_t out_indices,
             uintptr_t out_values, uintptr_t kernel, int64_t sum_op):
    """Sum the rows of equal index; return the number of distinct indices.

    ``sorted_keys``, ``permutation``: int64 [nnz], torch's sort of the flattened indices;
    ``indices``: int64 [dims, nnz] (contiguous); ``values``: [nnz] rows of ``row_bytes``.
    Writes the distinct indices as int64 rows [count, dims] and their sums as [count] rows.
    """
    cdef const int64_t *key = <const int64_t *>sorted_keys
    cdef const int64_t *order = <const int64_t *>permutation
    cdef const int64_t *idx = <const int64_t *>indices
    cdef const char *val = <const char *>values
    cdef int64_t *out_idx = <int64_t *>out_indices
    cdef char *out_val = <char *>out_values
    cdef kernel_t add = <kernel_t>kernel
    cdef Py_ssize_t j, pos, o = -1, line
    cdef Py_ssize_t fetched = row_bytes if row_bytes < PREFETCH_BYTES else PREFETCH_BYTES
    cdef int d
    cdef char *sum_row = NULL
    with nogil:
        for j in range(nnz):
            if j + PREFETCH_AHEAD < nnz:
                for line in range(0, fetched, 64):
                    shmcoll_prefetch(val + order[j + PREFETCH_AHEAD] * row_bytes + line)
            pos = order[j]
            if j > 0 and key[j] == key[j - 1]:
                if row_elems > 0:
                    add(sum_row, sum_row, <void *>(val + pos * row_bytes), 1, row_elems, row_elems, sum_op, 1.0)
            else:
                o += 1
                for d in range(dims):
                    out_idx[o * dims + d] = idx[d * nnz + pos]
                sum_row = out_val + o * row_bytes
                memcpy(sum_row, val + pos * row_bytes, row_bytes)
    return o + 1
