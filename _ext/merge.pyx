# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The two sums of a sparse all_reduce, in C: a rank's own duplicates (``coalesce``) and the ranks' parts
(``merge``), each in the order torch and Gloo add them, so the result is Gloo's bit for bit.

``coalesce`` is torch's ``coalesce()`` given torch's own sort of the flattened
indices: walking that permutation, the first row of each index is copied and
the later ones added one by one (torch's ``_coalesce_sparse_cpu`` does exactly
that, with ``axpy``). Doing it here writes the rows straight into the buffer the
all-gather sends from, with no new tensor per call.

Every rank's part arrives sorted by index (row-major order of the index
tuples, as ``coalesce()`` leaves it) and without duplicates, so the sum is a
k-way merge: take the smallest index at the ranks' heads, copy the value row of
the lowest rank that has it, and add the rows of the higher ranks that have it
too, in rank order. That is Gloo's result bit for bit: Gloo concatenates the
parts in rank order and coalesces, and coalescing keeps equal indices in their
order (a stable sort), copies the first row and adds the others one by one.
Adding row by row, each addition rounded to the value dtype, is what calling
the reduction kernel once per added row does (``n`` elements, one row).

The merge walks the indices twice: once to count the rows of the sum
(``merged_rows``, indices only), so that the sum's tensors are allocated at
their exact size, then to write them. They become the caller's tensor's own
(no copy after the merge).

Torch's way sorts the concatenation (n log n, then a gather of every row);
this reads each row once and is most of the speed of shm's sparse all_reduce.

Both add by calling the reduction kernel once per added row (``n`` elements, one
row): one rounding to the value dtype per addition, as torch's additions round.
"""
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

ctypedef void (*kernel_t)(void *out, void *first, void *rows, int64_t nrows, int64_t row_stride,
                          int64_t n, int64_t op, double scale) noexcept nogil


cdef inline int _compare(const int64_t *a, const int64_t *b, int dims) noexcept nogil:
    """-1, 0 or 1 as index tuple ``a`` sorts before, with or after ``b``."""
    cdef int d
    for d in range(dims):
        if a[d] != b[d]:
            return -1 if a[d] < b[d] else 1
    return 0


cdef Py_ssize_t _merge(const int64_t *idx, const char *val, const int64_t *count, int size, Py_ssize_t most,
                       int dims, Py_ssize_t row_elems, Py_ssize_t row_bytes, int64_t *out_idx, char *out_val,
                       Py_ssize_t nnz, kernel_t add, int64_t sum_op, Py_ssize_t *head) noexcept nogil:
    """The k-way merge; with ``out_idx`` NULL it only counts the rows of the sum (``nnz`` unused), else it
    writes them (``nnz``: the count, the column stride of ``out_idx``; -1 if there are more)."""
    cdef Py_ssize_t o = 0, row_stride = most * dims
    cdef int r, best, d
    cdef const int64_t *smallest
    cdef const int64_t *candidate
    cdef char *sum_row = NULL
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
        if out_idx != NULL:
            if o >= nnz:  # more rows than counted: stop rather than write past the end
                return -1
            for d in range(dims):
                out_idx[d * nnz + o] = smallest[d]
            sum_row = out_val + o * row_bytes
            memcpy(sum_row, val + (best * most + head[best]) * row_bytes, row_bytes)
        head[best] += 1
        # Lower ranks cannot hold this index: one of them would have been ``best``.
        for r in range(best + 1, size):
            if head[r] < count[r] and _compare(idx + r * row_stride + head[r] * dims, smallest, dims) == 0:
                if out_idx != NULL and row_elems > 0:
                    add(sum_row, sum_row, <void *>(val + (r * most + head[r]) * row_bytes), 1, row_elems,
                        row_elems, sum_op, 1.0)
                head[r] += 1
        o += 1


cdef Py_ssize_t *_heads(int size) except NULL:
    cdef Py_ssize_t *head = <Py_ssize_t *>calloc(size if size > 0 else 1, sizeof(Py_ssize_t))
    if head == NULL:
        raise MemoryError("sparse all_reduce: no memory for the merge's heads")
    return head


def merged_rows(uintptr_t indices, uintptr_t counts, int size, Py_ssize_t most, int dims):
    """The number of rows the sum of the parts has (the distinct indices among them); the arguments are
    ``merge``'s."""
    cdef Py_ssize_t *head = _heads(size)
    cdef Py_ssize_t rows
    with nogil:
        rows = _merge(<const int64_t *>indices, NULL, <const int64_t *>counts, size, most, dims, 0, 0, NULL,
                      NULL, 0, NULL, 0, head)
    free(head)
    return rows


def merge(uintptr_t indices, uintptr_t values, uintptr_t counts, int size, Py_ssize_t most, int dims,
          Py_ssize_t row_elems, Py_ssize_t row_bytes, uintptr_t out_indices, uintptr_t out_values,
          Py_ssize_t nnz, uintptr_t kernel, int64_t sum_op):
    """Sum ``size`` sorted, coalesced parts into ``nnz`` rows (``merged_rows``'s count).

    ``indices``: int64 [size, most, dims], rank r's first ``counts[r]`` rows valid;
    ``values``: [size, most] rows of ``row_bytes`` bytes (``row_elems`` elements);
    ``counts``: int64 [size]. Writes the indices as int64 [dims, nnz] (column o is
    the o-th row of the sum: the layout of a sparse tensor's indices) and the
    values as [nnz] rows.
    """
    cdef Py_ssize_t *head
    cdef Py_ssize_t rows
    if nnz < 0:
        raise ValueError(f"sparse all_reduce: a sum of {nnz} rows")
    head = _heads(size)  # after the check: a raise must not leave it allocated
    with nogil:
        rows = _merge(<const int64_t *>indices, <const char *>values, <const int64_t *>counts, size, most, dims,
                      row_elems, row_bytes, <int64_t *>out_indices, <char *>out_values, nnz, <kernel_t>kernel,
                      sum_op, head)
    free(head)
    if rows != nnz:  # cannot happen: the parts are this rank's own memory, unchanged since merged_rows
        merged = f"more than {nnz}" if rows < 0 else rows
        raise ValueError(f"sparse all_reduce: the parts merge into {merged} rows, {nnz} were counted")
    return rows


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
    cdef Py_ssize_t j, pos, o = -1
    cdef int d
    cdef char *sum_row = NULL
    with nogil:
        for j in range(nnz):
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
