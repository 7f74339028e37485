"""shmcoll's log: ``logging.getLogger("shmcoll")``, and how the environment turns it up.

What is logged:
  WARNING  a wait that lasts long, naming the ranks waited for (before any timeout fires)
  INFO     one summary per process group, on its first rank: nodes, arena, algorithms;
           once per process, if the sparse all_reduce must keep torch's slower sort
  DEBUG    every collective as it starts, on every rank

Like any library, shmcoll leaves handlers to the application: records reach
whatever ``logging`` set-up the program has (warnings reach stderr even with
none, through logging's last-resort handler). ``SHMCOLL_LOG_LEVEL`` (a level
name) or torch's ``TORCH_DISTRIBUTED_DEBUG`` (INFO -> INFO, DETAIL -> DEBUG)
ask for more; when the program has configured no handler at all, one stderr
handler is then added to the "shmcoll" logger, its lines prefixed with the rank.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("shmcoll")

_TORCH_LEVELS = {"INFO": logging.INFO, "DETAIL": logging.DEBUG}
WARN_AFTER_S = 10.0
_configured = False


def requested_level(environ=os.environ) -> int | None:
    """The level SHMCOLL_LOG_LEVEL or TORCH_DISTRIBUTED_DEBUG asks for, if any (the more verbose wins)."""
    levels = []
    name = environ.get("SHMCOLL_LOG_LEVEL", "").strip().upper()
    if name:
        level = logging.getLevelName(name)
        if not isinstance(level, int):
            raise ValueError(f"SHMCOLL_LOG_LEVEL={name!r} is not a logging level (DEBUG, INFO, WARNING, ERROR)")
        levels.append(level)
    torch_level = _TORCH_LEVELS.get(environ.get("TORCH_DISTRIBUTED_DEBUG", "").strip().upper())
    if torch_level is not None:
        levels.append(torch_level)
    return min(levels) if levels else None


def configure(rank: int) -> None:
    """Apply the requested level once per process; add a stderr handler only if none exists anywhere."""
    global _configured
    if _configured:
        return
    _configured = True
    level = requested_level()
    if level is None:
        return
    log.setLevel(level)
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(f"[rank{rank}] %(name)s %(levelname)s: %(message)s"))
        log.addHandler(handler)


def first_wait_warning(timeout_s: float) -> float:
    """Seconds of waiting after which a wait logs its first warning (then again each time it doubles):
    10 s, or a third of the timeout if that is shorter, so the warning always comes before the timeout."""
    return min(WARN_AFTER_S, timeout_s / 3)
