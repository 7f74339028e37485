# The running state that the compiled paths (front.pyx's small collectives, p2p.pyx's small transfers) and the Python
# ones share, as C fields and C methods both languages reach by name: nobody reads another module's private
# members (DESIGN, "Layers").
from libc.stdint cimport uint64_t, int64_t


cdef class StepCount:
    cdef public int64_t step, all_reached


cdef class GroupState:
    cdef public int64_t seq
    cdef public uint64_t desc
    cdef public bint in_collective
    cdef public object error


cdef class Backlog:
    cdef public object queue
    cdef public bint running, closed
    cpdef bint idle(self)


cdef class DebugSwitch:
    cdef object is_enabled_for
    cpdef bint on(self)
