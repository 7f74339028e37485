# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled front of the small collectives: from the group's method to the C schedule in one call.

    options.pxi   field_offset: where c10d's options keep a field, read here in C
    callers.pxi   whose code called: who may get the shared completed Work
    front.pxi     SmallCollectives: all_reduce, broadcast, all_gather (both forms), reduce_scatter_tensor,
                  reduce, gather, scatter, all_to_all (both forms) and the barrier, on the caller's thread or over
                  the lanes

The schedules it runs are schedules.pyx's (shmcoll/_schedules.pxd), the state it keeps state.pyx's
(shmcoll/_state.pxd).
"""
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport uint32_t, uint64_t, int64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from schedule cimport kernel_t, pool_start_t, sched_t, STATUS_DONE
from shmcoll._schedules cimport (Schedule, one_shot, one_shot_steps, chunked, reduce_scatter, allgather, broadcast,
                                 gather, scatter, alltoall, barrier, apart, unwrapped_step, KIND_ONE_SHOT,
                                 KIND_ONE_SHOT_STEPS, KIND_CHUNKED, KIND_REDUCE_SCATTER, KIND_ALLGATHER,
                                 KIND_BROADCAST)
from shmcoll._state cimport StepCount, GroupState, Backlog, DebugSwitch

include "lines.pxi"
include "size_tables.pxi"
include "callers.pxi"
include "options.pxi"
include "front.pxi"
