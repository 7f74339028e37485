"""Builds shmcoll's Cython extensions from _ext/ (no torch, no NumPy needed)."""
from Cython.Build import cythonize
from setuptools import Extension, setup

EXTENSIONS = [
    Extension(f"shmcoll._{name}", [f"_ext/{name}.pyx"], include_dirs=["_ext"],
              extra_compile_args=["-O3"])
    for name in ("segment", "sync", "copy", "state", "schedules", "front", "single_copy", "merge", "pool", "p2p", "callers")
]

setup(ext_modules=cythonize(EXTENSIONS, include_path=["_ext"], language_level=3))
