# The size tables of an all-to-all: the one place that knows a table row's layout. Textually included by
# schedules.pyx (alltoall.pxi's schedule), single_copy.pyx (its all-to-all) and front.pyx (all_to_all_single);
# every function inlines into its caller and runs without the GIL.
#
# Every rank's sizes are its own arguments, so before an all-to-all's first step each rank writes its row
# beside its slot of that step's buffer (``shmcoll.arena.Arena.tables``), and after the step every rank reads
# every row. Rank r's row is at ``tables`` + r * ``table_stride``, int64 words: what r sends to each of the L
# ranks, then what it expects from each, then a flag (a word the caller gives: the plans across nodes say with
# it whether a rank's sizes changed).
from libc.stdint cimport uint64_t, int64_t


cdef inline Py_ssize_t size_row_words(int size) noexcept nogil:
    return 2 * size + 1


cdef inline const int64_t *size_row(const char *tables, Py_ssize_t table_stride, int rank) noexcept nogil:
    return <const int64_t *>(tables + rank * table_stride)


# ``sends``/``recvs``: (address, bytes) uint64 pairs per rank, as the schedules take them (recvs[j]: what rank j
# sends us).
cdef inline void write_size_row(int64_t *row, int size, const uint64_t *sends, const uint64_t *recvs,
                                int64_t flag) noexcept nogil:
    cdef int rank
    for rank in range(size):
        row[rank] = <int64_t>sends[2 * rank + 1]
        row[size + rank] = <int64_t>recvs[2 * rank + 1]
    row[2 * size] = flag


# The first (sender, receiver) pair, in that order, whose block has another size than the receiver expects, as
# sender * size + receiver; -1 where every block agrees.
cdef inline int size_disagreement(int size, const char *tables, Py_ssize_t table_stride) noexcept nogil:
    cdef int sender, receiver
    for sender in range(size):
        for receiver in range(size):
            if (size_row(tables, table_stride, sender)[receiver]
                    != size_row(tables, table_stride, receiver)[size + sender]):
                return sender * size + receiver
    return -1


cdef inline Py_ssize_t longest_block(int size, const char *tables, Py_ssize_t table_stride) noexcept nogil:
    cdef Py_ssize_t longest = 0
    cdef int sender, receiver
    for sender in range(size):
        for receiver in range(size):
            if size_row(tables, table_stride, sender)[receiver] > longest:
                longest = size_row(tables, table_stride, sender)[receiver]
    return longest


cdef inline int64_t largest_flag(int size, const char *tables, Py_ssize_t table_stride) noexcept nogil:
    cdef int64_t largest = size_row(tables, table_stride, 0)[2 * size]
    cdef int rank
    for rank in range(1, size):
        if size_row(tables, table_stride, rank)[2 * size] > largest:
            largest = size_row(tables, table_stride, rank)[2 * size]
    return largest
