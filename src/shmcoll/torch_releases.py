"""The torch releases shmcoll supports, stated once: each release the whole test suite has passed on.

Everything that names the supported range reads it from ``RELEASES``:

  RELEASES[0]    the oldest supported: pyproject.toml's ``torch>=`` bound (which cannot import code;
                 tests/unit/test_torch_releases.py holds it to this), README's "Platforms and versions"
  RELEASES[-1]   the newest tested: a newer torch is used all the same, with one warning per process
                 (``_torch_compat.untested``), which says how to check it
  all of them    ``bash tests/matrix.sh`` runs the whole suite on each, every one in a venv of its own;
                 CI (``.ci/run``) runs the compatibility tier on the first and the last
                 ``python -m shmcoll info`` and docs/DESIGN.md name them

Adding a release (TESTING.md, "A new torch"): run the whole suite on it, ``bash tests/matrix.sh 2.16.0``, and
once it passes, add it below. Nothing here imports torch (or anything): the shell scripts read the list by
running this file, ``python3 src/shmcoll/torch_releases.py``, which prints it.
"""
from __future__ import annotations

import re

RELEASES = ("2.12.0", "2.13.0", "2.14.1", "2.15.0")


def minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version such as "2.15.0" or "2.16.0.dev20270101+cpu"; None if it has none."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return None if found is None else (int(found[1]), int(found[2]))


OLDEST_SUPPORTED = minor(RELEASES[0])
NEWEST_TESTED = minor(RELEASES[-1])

if __name__ == "__main__":
    print(" ".join(RELEASES))
