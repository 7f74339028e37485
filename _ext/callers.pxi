# Whose code called shmcoll: the first Python frame outside the shmcoll package. Textually included by
# callers.pyx (for Python callers) and schedules.pyx (for front.pxi): every function here inlines into its caller.
#
# A synchronous collective's Work can be one object shared by every such call, and hold nothing, only where
# nobody can see it again: torch's own wrappers (``dist.all_reduce`` and the rest) wait for a synchronous Work
# and drop it, where a caller of the group's method may keep it and ask for its ``result()``. The caller is
# the one fact that tells them apart (``shmcoll.work.ProgressEngine.completed``, ``front.pxi``); a new Work
# costs more than the rest of an 8-byte all-reduce's own work (0.6-1.3 us, a pybind11 object), this check
# about a tenth of that.
#
# Cython functions push no frame, so the innermost Python frame is the shmcoll module that called in
# (``shmcoll.pg_bindings`` and below); the walk skips the package's frames by their module name.
from cpython.object cimport PyObject

cdef extern from *:
    """
    #include <frameobject.h>
    /* Borrowed references, on every CPython shmcoll builds for (PyFrame_GetGlobals is 3.11's). */
    static PyObject *shmcoll_frame_globals(PyFrameObject *frame) {
    #if PY_VERSION_HEX >= 0x030B0000
        PyObject *globals = PyFrame_GetGlobals(frame);
        Py_XDECREF(globals);  /* the frame holds it */
        return globals;
    #else
        return frame->f_globals;
    #endif
    }
    static PyFrameObject *shmcoll_frame_back(PyFrameObject *frame) {
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_XDECREF(back);  /* the running frame below holds it */
        return back;
    }
    """
    ctypedef struct PyFrameObject
    PyFrameObject *PyEval_GetFrame()
    PyObject *shmcoll_frame_globals(PyFrameObject *frame)
    PyFrameObject *shmcoll_frame_back(PyFrameObject *frame)
    PyObject *PyDict_GetItemString(PyObject *d, const char *key)
    int PyUnicode_Tailmatch(object text, object part, Py_ssize_t start, Py_ssize_t end, int direction) except -1

cdef str _PACKAGE = "shmcoll."


cdef inline bint called_from(object module_globals) noexcept:
    """Whether the innermost Python frame outside the shmcoll package runs code of the module whose globals are
    ``module_globals`` (False where there is none, or on any error)."""
    cdef PyFrameObject *frame = PyEval_GetFrame()
    cdef PyObject *globals
    cdef PyObject *name
    while frame != NULL:
        globals = shmcoll_frame_globals(frame)
        if globals == NULL:
            return False
        if globals == <PyObject *>module_globals:
            return True
        name = PyDict_GetItemString(globals, "__name__")
        if name == NULL or type(<object>name) is not str:
            return False
        try:
            if not PyUnicode_Tailmatch(<object>name, _PACKAGE, 0, len(_PACKAGE), -1):
                return False
        except Exception:
            return False
        frame = shmcoll_frame_back(frame)
    return False

