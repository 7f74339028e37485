"""The settings every rank of a group must share, agreed once when the group is made.

The settings ``_env`` marks group-wide (``_env.group_wide``) shape the node arena's layout or
decide a collective's plan
(one-shot or chunked, how many lanes, which path), and each rank derives them from its own
environment. Two ranks that read different values would lay out the same
segment differently or run different schedules over it: a wrong result or a hang,
never an error. So the group uses its rank 0's values on every rank, and says so
(a WARNING on rank 0 naming every rank that differs, and on each such rank).
Rank 0's, not the node creator's, because some plans span nodes (which size of
all-reduce crosses them in one exchange must be the same on every node).

The other settings may differ: the wait budgets only change how a rank waits;
``SHMCOLL_THREADS`` is agreed per node as the least any rank asks for
(``lanes.agree``); ``SHMCOLL_SHM_DIR`` is the node creator's, which is the one
that creates the arena; ``SHMCOLL_HOSTID`` is what tells the nodes apart.
"""
from __future__ import annotations

import json

from shmcoll import _env
from shmcoll._logging import log


def agree_settings(store, keys: str, rank: int, size: int, settings: _env.Settings) -> _env.Settings:
    """``settings`` with the group-wide ones replaced by rank 0's (collective: every rank calls it)."""
    mine = _env.group_wide(settings)
    store.set(f"{keys}/settings/{rank}", json.dumps(mine))
    if rank == 0:
        theirs = [json.loads(value) for value in store.multi_get([f"{keys}/settings/{r}" for r in range(1, size)])]
        for variable, value in mine.items():
            differ = {r: values[variable] for r, values in enumerate(theirs, start=1) if values[variable] != value}
            if differ:
                log.warning("%s differs between the ranks of a new shm group: rank 0 has %s, %s; the group uses "
                            "rank 0's value on every rank (it shapes the shared arena or a collective's plan, "
                            "which every rank must share)", variable, value,
                            _some(f"rank {r} {v}" for r, v in differ.items()))
        return settings
    agreed = json.loads(store.get(f"{keys}/settings/0"))
    for variable, value in mine.items():
        if agreed[variable] != value:
            log.warning("rank %d: %s is %s here but %s on rank 0; this shm group uses rank 0's value", rank,
                        variable, value, agreed[variable])
    return _env.with_group_wide(settings, agreed)


def _some(items, most: int = 8) -> str:
    """The first ``most`` of ``items``, joined, and how many more (a warning stays readable at 1000 ranks)."""
    items = list(items)
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more
