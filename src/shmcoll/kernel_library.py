"""The reduction kernels as one native library, so a warm start never imports Numba.

Importing Numba and setting up its code generator costs about half a second per
process, which would be nearly all of ``init_process_group("shm")``. So the first
time (``python -m shmcoll warm``, or the first group on a machine) Numba
compiles every dtype's C entry point (``kernels.compile_entry``), LLVM emits
them as one position-independent object, and the system C compiler links it
into ``kernels-<key>.so``. Later processes ``dlopen`` that file and read the
addresses: about a millisecond.

The key hashes everything the machine code depends on: the kernel sources
(``kernels``, ``kernel_intrinsics``, ``kernel_abi`` and this file), the Numba
and llvmlite installs, and the CPU (model and feature flags, since the code is
compiled for the host CPU, like Numba's own JIT). A changed input gets a new
file; a library made elsewhere is never loaded here.

Numba's code names a few helpers of its runtime (raising an exception, the
reference counting of arrays it allocates). Nothing calls them: the kernels
raise only for an op or shape the Python layer has already rejected, and the
entry points allocate nothing. The library defines them to stop the process
with a message instead of failing to load.

When no library can be built (no C compiler), ``entry_point`` falls back to
Numba's JIT and its on-disk cache: slower start-up, same kernels.
A build that fails for any other reason (the linker refuses the object, say)
leaves ``<library>.failed`` with the error, so that later processes fall back
at once instead of each compiling for ten seconds to fail the same way;
``python -m shmcoll warm`` tries again.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import tempfile
import threading

from shmcoll import kernel_abi
from shmcoll._logging import log

__all__ = ["entry_point", "warm", "library_path", "loaded_from", "build", "earlier_failure", "failure_path"]

_SYMBOL = "shmcoll_reduce_{}"

# Numba runtime helpers the error paths of the kernels name (see the module docstring).
_STUBS_C = r"""
#include <stdio.h>
#include <stdlib.h>

static void unreachable(const char *what) {
    fprintf(stderr, "shmcoll: a reduction kernel reached Numba's %s, which the Python layer should have "
                    "made impossible (an unsupported op or shape); stopping rather than returning a wrong "
                    "result. Please report this.\n", what);
    abort();
}

#define STUB(name) __attribute__((visibility("hidden"))) void name(void) { unreachable(#name); }
STUB(numba_gil_ensure)
STUB(numba_gil_release)
STUB(numba_do_raise)
STUB(numba_unpickle)
STUB(numba_runtime_build_excinfo_struct)
STUB(NRT_MemInfo_call_dtor)
STUB(NRT_Free)
"""

_lock = threading.Lock()
_addresses: dict[str, int] = {}
_library = None  # the loaded ctypes.CDLL, kept so its code stays mapped
_library_file: str | None = None


def _cache_dir() -> str:
    """Where the library lives: beside Numba's cache of the same kernels."""
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        return configured
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")
    if os.access(os.path.dirname(here), os.W_OK) and (not os.path.exists(here) or os.access(here, os.W_OK)):
        return here
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "shmcoll")


def _cpu_identity() -> bytes:
    """The CPU's model and feature lines from /proc/cpuinfo (first processor only)."""
    lines = []
    try:
        with open("/proc/cpuinfo", "rb") as f:
            for line in f:
                if not line.strip():
                    break
                key = line.split(b":", 1)[0].strip()
                if key in (b"vendor_id", b"cpu family", b"model", b"model name", b"flags",
                           b"CPU implementer", b"CPU part", b"Features", b"cpu", b"isa"):
                    lines.append(line.strip())
    except OSError:
        pass
    return b"\n".join(lines) + platform.machine().encode()


def _install_identity(package: str) -> bytes:
    """Path, size and mtime of a package's __init__ (a reinstall or upgrade changes it), without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin:
        return package.encode() + b":missing"
    st = os.stat(spec.origin)
    return f"{spec.origin}:{st.st_size}:{st.st_mtime_ns}".encode()


def library_path() -> str:
    """The library file this machine and install would load (it may not exist yet)."""
    digest = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("kernels.py", "kernel_intrinsics.py", "kernel_abi.py", "kernel_library.py"):
        with open(os.path.join(here, name), "rb") as f:
            digest.update(f.read())
    for package in ("numba", "llvmlite"):
        digest.update(_install_identity(package))
    digest.update(_cpu_identity())
    return os.path.join(_cache_dir(), f"kernels-{digest.hexdigest()[:20]}.so")


class NoCompilerError(RuntimeError):
    """No C compiler to link the library with (found before compiling anything, so not worth recording)."""


def failure_path(path: str) -> str:
    """The marker a failed build of the library at ``path`` leaves (its text is the error)."""
    return path + ".failed"


def _record_failure(path: str, error: BaseException) -> None:
    try:
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), prefix=".kernels-failed-",
                                         delete=False) as f:
            f.write(f"{type(error).__name__}: {error}\n")
        os.replace(f.name, failure_path(path))
    except OSError:  # an unwritable cache directory: every process will try (and fail) again
        pass


def _compiler() -> str | None:
    """$CC if set (and found), else the first of cc, gcc, clang; None, before any compiling, if none is."""
    configured = os.environ.get("CC")
    if configured:
        return shutil.which(configured)
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build(path: str) -> None:
    """Compile every entry point with Numba and link them into the library at ``path`` (atomically)."""
    import llvmlite.binding as llvm

    from shmcoll import kernels

    compiler = _compiler()
    if compiler is None:
        raise NoCompilerError(f"no C compiler ({os.environ.get('CC') or 'cc, gcc or clang'}) to link the kernel library")
    modules = []
    for dtype in kernel_abi.DTYPES:
        entry = kernels.compile_entry(dtype)
        module = llvm.parse_assembly(entry.inspect_llvm())
        # Export the entry point alone, under a stable name: every other definition becomes
        # internal, so the dtypes' modules (which share helper names) link into one.
        for symbol in list(module.functions) + list(module.global_variables):
            if symbol.is_declaration:
                continue
            if symbol.name == entry.native_name:
                symbol.name = _SYMBOL.format(dtype)
            else:
                symbol.linkage = "internal"
        modules.append(module)
    linked = modules[0]
    for module in modules[1:]:
        linked.link_in(module)
    linked.verify()
    target = llvm.Target.from_default_triple()
    machine = target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                           opt=3, reloc="pic", codemodel="default")
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".kernels-build-") as work:
        obj, stubs, out = (os.path.join(work, name) for name in ("kernels.o", "stubs.c", "kernels.so"))
        with open(obj, "wb") as f:
            f.write(machine.emit_object(linked))
        with open(stubs, "w") as f:
            f.write(_STUBS_C)
        done = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", out, obj, stubs],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"linking the kernel library failed ({compiler}): {done.stderr.strip()[-2000:]}")
        os.replace(out, path)  # atomic: processes building at once each install a whole library


def _load(path: str) -> dict[str, int]:
    global _library, _library_file
    library = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    addresses = {dtype: ctypes.cast(getattr(library, _SYMBOL.format(dtype)), ctypes.c_void_p).value
                 for dtype in kernel_abi.DTYPES}
    _library, _library_file = library, path
    return addresses


def earlier_failure(path: str) -> str | None:
    """The error an earlier build of the library at ``path`` recorded, if one did."""
    try:
        with open(failure_path(path)) as f:
            return f.read().strip() or "unknown error"
    except OSError:
        return None


def _build_recording_failure(path: str, retry: bool) -> None:
    """``build(path)``, unless an earlier build failed (and not ``retry``); a failure leaves its marker."""
    failed = None if retry else earlier_failure(path)
    if failed is not None:
        raise RuntimeError(f"an earlier build failed ({failed}); `python -m shmcoll warm` tries again")
    try:
        build(path)
    except NoCompilerError:
        raise  # found before compiling anything: cheap to find again, and a compiler may be installed later
    except Exception as error:
        _record_failure(path, error)
        raise
    with contextlib.suppress(OSError):
        os.unlink(failure_path(path))


def warm(retry: bool = False) -> None:
    """Make every entry point callable: load the library, else build it, else use Numba's JIT.

    A build that failed before is not tried again unless ``retry``.
    """
    if _addresses:
        return
    with _lock:
        if _addresses:
            return
        path = library_path()
        try:
            if not os.path.exists(path):
                _build_recording_failure(path, retry)
            _addresses.update(_load(path))
            return
        except Exception as error:  # no compiler, read-only cache, odd toolchain: the JIT still works
            log.info("shmcoll: kernel library %s unavailable (%s: %s); using Numba's JIT kernels",
                     path, type(error).__name__, error)
        from shmcoll import kernels

        _addresses.update({dtype: kernels.entry_point(dtype) for dtype in kernel_abi.DTYPES})


def loaded_from() -> str | None:
    """The library file in use, or None (not loaded yet, or Numba's JIT instead)."""
    return _library_file


def entry_point(dtype: str) -> int:
    """Address of dtype's C entry point (see kernel_abi)."""
    address = _addresses.get(dtype)
    if address is None:
        warm()
        address = _addresses.get(dtype)
        if address is None:
            raise ValueError(f"shmcoll: no reduction kernel for dtype {dtype!r}")
    return address

