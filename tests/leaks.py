"""What a process holds of shared-memory segments: its mappings and open descriptors of them.

The arena has no name on the default path (O_TMPFILE), so a listing of /dev/shm
cannot show it leaking; /proc/self/maps and /proc/self/fd can: an unnamed
segment shows there as "/dev/shm/#<inode> (deleted)", a named one under its name.
A rank takes ``references()`` before its first group and after its last, and the
difference must be empty (tests/worker.py).
"""
from __future__ import annotations

import os


def references(shm_dir: str | None = None) -> list[str]:
    """Every mapping and open descriptor of an unnamed file in ``shm_dir`` (default: $SHMCOLL_SHM_DIR or
    /dev/shm), or of a file with shmcoll's name prefix anywhere, as "map <range> <path>" / "fd <n> <path>".
    (Not every file there: other libraries keep theirs, e.g. the semaphores of torch.compile's workers.)"""
    shm_dir = (shm_dir or os.environ.get("SHMCOLL_SHM_DIR") or "/dev/shm").rstrip("/") + "/"

    def ours(path: str) -> bool:  # an unnamed segment ("#<inode>") in shm_dir, or a named one of ours anywhere
        path = path.removesuffix(" (deleted)")
        name = os.path.basename(path)
        return name.startswith("shmcoll-") or (path.startswith(shm_dir) and name.startswith("#"))

    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) == 6 and ours(fields[5].strip()):
                found.append(f"map {fields[0]} {fields[5].strip()}")
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listdir itself used, closed since
            continue
        if ours(target):
            found.append(f"fd {fd} {target}")
    return found


def new_references(before: list[str], shm_dir: str | None = None) -> list[str]:
    """What ``references()`` holds now that it did not at ``before``."""
    return sorted(set(references(shm_dir)) - set(before))
