"""Faults the tests inject into a rank from outside the package (tests/worker.py installs them).

``TEST_FAIL_ATTACH=1,3``: the listed ranks (``$RANK``, the default group's) fail to map their node's
arena, as if the creator's /proc/PID/fd were out of reach, and so run as nodes of their own; a listed
creator fails to create it, which is an error on every rank (shmcoll.node_arena).

``TEST_READ_COST=1.0``: the single-copy probe finds that a read of a peer costs that many copies, on every
rank, so that the default mode picks its spans by it whatever this machine's reads cost (shmcoll.single_copy).

``TEST_OPTIONS_BY_GETTERS=1``: the probe finds no field of c10d's options, as on a torch whose structs it cannot
read, so the compiled small collectives read every option through its pybind getter (shmcoll.option_fields).
"""
from __future__ import annotations

import errno
import os


def install_from_environment() -> None:
    listed = {int(r) for r in os.environ.get("TEST_FAIL_ATTACH", "").split(",") if r.strip()}
    if int(os.environ.get("RANK", "-1")) in listed:
        _fail_attach(int(os.environ["RANK"]))
    if os.environ.get("TEST_READ_COST"):
        from shmcoll import single_copy

        cost = float(os.environ["TEST_READ_COST"])
        single_copy.read_cost = lambda pid, address: cost
    if os.environ.get("TEST_OPTIONS_BY_GETTERS"):
        from shmcoll import option_fields

        found = option_fields.offsets
        option_fields.offsets = lambda options_type: {name: -1 for name in found(options_type)}


def _fail_attach(me: int) -> None:
    from shmcoll import arena
    from shmcoll.errors import AttachError

    def cannot_create(*args, **kwargs):
        raise OSError(errno.EACCES, f"TEST_FAIL_ATTACH (tests/fault_hooks.py) names rank {me}")

    def cannot_map(name, size, settings, ranks, local_rank, creator_pidns):
        raise AttachError(f"rank {me} could not map the shm arena of rank {ranks[0]}: TEST_FAIL_ATTACH "
                          f"(tests/fault_hooks.py) names rank {me}")

    arena._create_unique = cannot_create
    arena._map_created = cannot_map
