# The barrier: one step that carries no data (shmcoll.algorithms.barrier runs the same in Python).
# Textually included by schedules.pyx.


cdef Py_ssize_t barrier(sched_t *s, uint32_t step, uint64_t desc) noexcept nogil:
    """Post ``step`` with ``desc``, then wait (one slice at most) for every rank to reach it: DONE, MISMATCH (a
    peer posted it for another collective), or 0 (the slice ended first; ``algorithms.barrier.finish`` goes on)."""
    post_step(s, step, desc)
    if all_reached(s, step) >= 0:
        return 0
    if _first_mismatch(s.lines, 0, s.size, step, desc) >= 0:
        return STATUS_MISMATCH
    return STATUS_DONE
