# Whose code called shmcoll: the first Python frame outside the shmcoll package. Textually included by
# callers.pyx (for Python callers) and front.pyx (for front.pxi): every function here inlines into its caller.
#
# A synchronous collective's Work can be one object shared by every such call, and hold nothing, only where
# nobody can see it again: torch's own wrappers (``dist.all_reduce`` and the rest) wait for a synchronous Work
# and drop it, where a caller of the group's method may keep it and ask for its ``result()``. The caller is
# the one fact that tells them apart (``shmcoll.work.ProgressEngine.completed``, ``front.pxi``); a new Work
# costs more than the rest of an 8-byte all-reduce's own work (0.6-1.3 us, a pybind11 object), this check
# a few pointer reads per frame.
#
# Cython functions push no frame, so the innermost Python frame is the shmcoll module that called in
# (``shmcoll.process_group`` and below); the walk skips the package's frames by their module's name, read once
# per module.
#
# The walk reads the interpreter's own frame records where CPython keeps them apart from frame objects (3.11
# to 3.13, its internal header): asking for frame objects there (PyEval_GetFrame, PyFrame_GetBack) makes
# one per frame walked, which cost an 8-byte dist.all_reduce 0.2-0.3 us (BENCHMARKS.md, "The 8 B call's floor": the caller check).
# Elsewhere (3.10, whose frames are objects anyway, and a CPython newer than this was written for) it
# walks the frame objects.
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF

cdef extern from *:
    """
    #if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(PYPY_VERSION)
    #  define SHMCOLL_INTERPRETER_FRAMES 1
    #  ifndef Py_BUILD_CORE
    #    define Py_BUILD_CORE 1
    #  endif
    #  include "internal/pycore_frame.h"
    #else
    #  define SHMCOLL_INTERPRETER_FRAMES 0
    #  include <frameobject.h>
    #endif

    /* The globals of the innermost running Python frame (borrowed), and of the one below it: *position
       stands for the frame walked. NULL where there is none. */
    #if SHMCOLL_INTERPRETER_FRAMES
    typedef _PyInterpreterFrame *shmcoll_frame_t;
    static inline int shmcoll_frame_skipped(_PyInterpreterFrame *frame) {
    #  if PY_VERSION_HEX >= 0x030C0000
        if (frame->owner == FRAME_OWNED_BY_CSTACK) return 1;  /* the C stack's entry marker, no code's */
    #  endif
        return _PyFrame_IsIncomplete(frame);  /* pushed, not yet running: PyFrame_GetBack skips these too */
    }
    static inline _PyInterpreterFrame *shmcoll_running(_PyInterpreterFrame *frame) {
        while (frame != NULL && shmcoll_frame_skipped(frame)) frame = frame->previous;
        return frame;
    }
    static inline PyObject *shmcoll_innermost_globals(shmcoll_frame_t *position) {
        PyThreadState *tstate = PyThreadState_Get();
    #  if PY_VERSION_HEX >= 0x030D0000
        *position = shmcoll_running(tstate->current_frame);
    #  else
        *position = shmcoll_running(tstate->cframe->current_frame);
    #  endif
        return *position == NULL ? NULL : (*position)->f_globals;
    }
    static inline PyObject *shmcoll_outer_globals(shmcoll_frame_t *position) {
        *position = shmcoll_running((*position)->previous);
        return *position == NULL ? NULL : (*position)->f_globals;
    }
    #else
    typedef PyFrameObject *shmcoll_frame_t;
    static PyObject *shmcoll_frame_globals(PyFrameObject *frame) {
        if (frame == NULL) return NULL;
    #  if PY_VERSION_HEX >= 0x030B0000
        PyObject *globals = PyFrame_GetGlobals(frame);
        Py_XDECREF(globals);  /* the frame holds it */
        return globals;
    #  else
        return frame->f_globals;
    #  endif
    }
    static inline PyObject *shmcoll_innermost_globals(shmcoll_frame_t *position) {
        *position = PyEval_GetFrame();
        return shmcoll_frame_globals(*position);
    }
    static inline PyObject *shmcoll_outer_globals(shmcoll_frame_t *position) {
        PyFrameObject *back = PyFrame_GetBack(*position);
        Py_XDECREF(back);  /* the running frame below holds it */
        *position = back;
        return shmcoll_frame_globals(back);
    }
    #endif
    """
    ctypedef void *shmcoll_frame_t
    PyObject *shmcoll_innermost_globals(shmcoll_frame_t *position)
    PyObject *shmcoll_outer_globals(shmcoll_frame_t *position)
    PyObject *PyDict_GetItem(PyObject *d, PyObject *key)
    int PyUnicode_Tailmatch(object text, object part, Py_ssize_t start, Py_ssize_t end, int direction) except -1

cdef str _PACKAGE = "shmcoll."
cdef str _NAME = "__name__"  # one key object, its hash kept: each lookup makes no string

# The globals of the package's modules met so far (held: a module's globals never move nor die while it is
# imported, and held they cannot be freed and their address reused), so that the walk passes the package's
# frames by address, reading no module name: the package has fewer modules than this holds.
cdef enum:
    _KNOWN_MOST = 32
cdef PyObject *_known[_KNOWN_MOST]
cdef Py_ssize_t _known_count = 0


cdef inline bint _known_package(PyObject *globals) noexcept:
    cdef Py_ssize_t i
    for i in range(_known_count):
        if _known[i] == globals:
            return True
    return False


cdef bint _in_package(PyObject *globals) noexcept:
    """Whether ``globals`` are those of a module of the package (its name starts with ``shmcoll.``); learnt."""
    global _known_count
    cdef PyObject *name = PyDict_GetItem(globals, <PyObject *>_NAME)
    if name == NULL or type(<object>name) is not str:
        return False
    try:
        if not PyUnicode_Tailmatch(<object>name, _PACKAGE, 0, len(_PACKAGE), -1):
            return False
    except Exception:
        return False
    if _known_count < _KNOWN_MOST:
        Py_INCREF(<object>globals)
        _known[_known_count] = globals
        _known_count += 1
    return True


cdef inline bint called_from(object module_globals) noexcept:
    """Whether the innermost Python frame outside the shmcoll package runs code of the module whose globals are
    ``module_globals``, a module outside the package (False where there is none, or on any error)."""
    cdef shmcoll_frame_t position
    cdef PyObject *globals = shmcoll_innermost_globals(&position)
    while globals != NULL:
        if globals == <PyObject *>module_globals:
            return True
        if not (_known_package(globals) or _in_package(globals)):
            return False
        globals = shmcoll_outer_globals(&position)
    return False
