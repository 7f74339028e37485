# cython: language_level=3, boundscheck=False, wraparound=False
"""Shared-memory segments: create, attach, map and unlink files in a tmpfs.

A segment is a file in a memory-backed directory (``/dev/shm`` by default,
which is exactly what ``shm_open`` uses) mapped MAP_SHARED. Creation is
exclusive (``O_CREAT | O_EXCL``, mode 0600, no symlinks followed) and reserves
all its pages with ``posix_fallocate``: a full tmpfs is an ``OSError`` at
creation, never a SIGBUS on first touch.

The mapping stays valid after the file is unlinked, which is how the arena
guarantees that nothing is left behind however the processes end.
"""
from libc.errno cimport errno, ENOSPC, EEXIST
from libc.stdint cimport uintptr_t
from libc.string cimport strerror, memset
from cpython.buffer cimport PyBuffer_FillInfo

cdef extern from "<fcntl.h>" nogil:
    int open(const char *path, int flags, ...)
    int O_RDWR, O_CREAT, O_EXCL, O_CLOEXEC, O_NOFOLLOW, O_TMPFILE
    int posix_fallocate(int fd, long offset, long length)

cdef extern from "<unistd.h>" nogil:
    int close(int fd)
    int unlink(const char *path)
    unsigned int geteuid()
    int getpid()

cdef extern from "<sys/stat.h>" nogil:
    struct stat:
        long st_size
        unsigned int st_uid
        unsigned int st_mode
    int fstat(int fd, stat *buf)

cdef extern from "<sys/statvfs.h>" nogil:
    struct statvfs:
        unsigned long f_bsize
        unsigned long f_frsize
        unsigned long f_bavail
        unsigned long f_blocks
    int c_statvfs "statvfs"(const char *path, statvfs *buf)

cdef extern from "<sys/mman.h>" nogil:
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)
    int PROT_READ, PROT_WRITE, MAP_SHARED
    void *MAP_FAILED


cdef object _os_error(int err, str what, str path):
    """The one place C failures become Python exceptions."""
    return OSError(err, f"{what} {path}: {strerror(err).decode()}", path)


def free_bytes(str directory):
    """Bytes an unprivileged process may still allocate in ``directory``."""
    cdef statvfs st
    if c_statvfs(directory.encode(), &st) != 0:
        raise _os_error(errno, "statvfs", directory)
    return st.f_bavail * st.f_frsize


def total_bytes(str directory):
    """Size of the filesystem holding ``directory``."""
    cdef statvfs st
    if c_statvfs(directory.encode(), &st) != 0:
        raise _os_error(errno, "statvfs", directory)
    return st.f_blocks * st.f_frsize


def unlink_path(str path):
    """Remove a segment's name; existing mappings stay valid."""
    if unlink(path.encode()) != 0:
        raise _os_error(errno, "unlink", path)


cdef class Segment:
    """A MAP_SHARED mapping of a whole segment file; exposes the buffer protocol.

    ``close()`` unmaps. While NumPy arrays (or other buffers) still view the
    mapping, unmapping is deferred until the last of them is released, so a
    stale view can never touch unmapped memory.
    """
    cdef char *base
    cdef readonly Py_ssize_t size
    cdef readonly str path
    cdef readonly int fd  # kept open by create_unnamed() until release_fd(): peers open /proc/PID/fd/FD
    cdef int exports
    cdef bint closing

    def __cinit__(self):
        self.base = NULL
        self.fd = -1
        self.exports = 0
        self.closing = False

    def release_fd(self):
        """Close the descriptor that lets peers open an unnamed segment; the mapping stays."""
        if self.fd >= 0:
            close(self.fd)
            self.fd = -1

    @property
    def address(self):
        """Address of the first byte of the mapping in this process."""
        if self.base == NULL:
            raise ValueError(f"segment {self.path} is closed")
        return <uintptr_t>self.base

    @property
    def closed(self):
        return self.base == NULL or self.closing

    cdef int _map(self, int fd) except -1:
        cdef void *p = mmap(NULL, <size_t>self.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        if p == MAP_FAILED:
            raise _os_error(errno, "mmap", self.path)
        self.base = <char *>p
        return 0

    cdef int _reserve_and_map(self, int fd, str directory) except -1:
        """Reserve every page (a full tmpfs fails here, not with SIGBUS later), then map."""
        cdef int err
        cdef long size = self.size
        with nogil:
            err = posix_fallocate(fd, 0, size)
        if err == ENOSPC:
            raise OSError(
                ENOSPC,
                f"cannot reserve {self.size} bytes in {directory}: only {free_bytes(directory)} "
                f"bytes free there (of {total_bytes(directory)})",
                directory,
            )
        if err != 0:
            raise _os_error(err, "posix_fallocate", self.path)
        return self._map(fd)

    cdef void _unmap(self) noexcept:
        if self.base != NULL:
            munmap(self.base, <size_t>self.size)
            self.base = NULL

    def close(self):
        """Unmap now, or as soon as the last exported buffer is released."""
        if self.exports > 0:
            self.closing = True
        else:
            self._unmap()

    def __getbuffer__(self, Py_buffer *view, int flags):
        if self.base == NULL or self.closing:
            raise ValueError(f"segment {self.path} is closed")
        PyBuffer_FillInfo(view, self, self.base, self.size, 0, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        self.exports -= 1
        if self.exports == 0 and self.closing:
            self._unmap()

    def __dealloc__(self):
        # Buffers hold a reference to the segment, so none is alive here.
        self._unmap()
        if self.fd >= 0:
            close(self.fd)

    def __repr__(self):
        state = "closed" if self.closed else f"at 0x{<uintptr_t>self.base:x}"
        return f"<Segment {self.path} {self.size} bytes {state}>"


def create(str path, Py_ssize_t size):
    """Create ``path`` exclusively (mode 0600), reserve ``size`` bytes and map it.

    Raises FileExistsError if the name exists (never reuses a file) and
    OSError(ENOSPC) naming the needed and free bytes if the filesystem is too
    small. On any failure nothing is left behind.
    """
    cdef bytes bpath = path.encode()
    cdef int fd
    if size <= 0:
        raise ValueError(f"segment size must be positive, got {size}")
    fd = open(bpath, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
    if fd < 0:
        raise _os_error(errno, "create", path)
    seg = Segment()
    seg.path = path
    seg.size = size
    try:
        seg._reserve_and_map(fd, path.rsplit("/", 1)[0] or "/")
    except BaseException:
        close(fd)
        unlink(bpath)
        raise
    close(fd)
    return seg


def create_unnamed(str directory, Py_ssize_t size):
    """Create a segment with no name in ``directory`` (O_TMPFILE, mode 0600), reserve and map it.

    Nothing ever appears in the directory, so nothing can be left there however
    this process ends; the space still counts against that filesystem. The
    descriptor stays open (``fd``, ``path`` = /proc/PID/fd/FD) so that peers can
    ``attach(path, size, follow=True)`` until ``release_fd()``.
    Raises OSError(EOPNOTSUPP/EISDIR/EINVAL) where the filesystem lacks O_TMPFILE.
    """
    cdef int fd
    if size <= 0:
        raise ValueError(f"segment size must be positive, got {size}")
    fd = open(directory.encode(), O_RDWR | O_TMPFILE | O_CLOEXEC, 0o600)
    if fd < 0:
        raise _os_error(errno, "create an unnamed file in", directory)
    seg = Segment()
    seg.path = f"/proc/{getpid()}/fd/{fd}"
    seg.size = size
    try:
        seg._reserve_and_map(fd, directory)
    except BaseException:
        close(fd)
        raise
    seg.fd = fd
    return seg


def attach(str path, Py_ssize_t size, bint follow=False):
    """Map an existing segment created by this user, checking its size.

    ``follow``: ``path`` is a /proc/PID/fd/FD link to an unnamed segment.
    """
    cdef bytes bpath = path.encode()
    cdef stat st
    cdef int fd = open(bpath, O_RDWR | O_CLOEXEC | (0 if follow else O_NOFOLLOW))
    if fd < 0:
        raise _os_error(errno, "open", path)
    seg = Segment()
    seg.path = path
    seg.size = size
    try:
        if fstat(fd, &st) != 0:
            raise _os_error(errno, "fstat", path)
        if st.st_uid != geteuid():
            raise PermissionError(f"segment {path} belongs to uid {st.st_uid}, not to this user")
        if st.st_size < size:
            raise OSError(f"segment {path} holds {st.st_size} bytes, expected {size}")
        seg._map(fd)
    finally:
        close(fd)
    return seg
