"""Every ``SHMCOLL_*`` environment variable, parsed once. Documented in README.md."""
import os
from dataclasses import dataclass, field, fields, replace

KiB = 1024
MiB = 1024 * KiB


def parse_bytes(text: str) -> int:
    """Parse '4096', '256K', '1M', '2G' (binary units)."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": KiB, "M": MiB, "G": 1024 * MiB}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def _single_copy(text: str) -> str:
    """Parse 'auto', '0' or '1'."""
    if text.strip().lower() not in ("auto", "0", "1"):
        raise ValueError(text)
    return text.strip().lower()


GROUP_WIDE = {"group_wide": True}


@dataclass(frozen=True)
class Settings:
    """Effective tuning and placement settings (see README.md, "Environment variables")."""

    shm_dir: str = "/dev/shm"
    # Marked GROUP_WIDE: they shape the arena or a collective's plan, so every rank of a group must
    # use the same value; the group uses its rank 0's (shmcoll.agreement).
    chunk_bytes: int = field(default=512 * KiB, metadata=GROUP_WIDE)
    small_bytes: int = field(default=64 * KiB, metadata=GROUP_WIDE)
    p2p_bytes: int = field(default=64 * KiB, metadata=GROUP_WIDE)
    threads: int | None = None  # lanes per rank; None: torch.get_num_threads() (the node agrees on the least)
    thread_bytes: int = field(default=64 * KiB, metadata=GROUP_WIDE)  # least bytes per lane
    segment_bytes: int = field(default=2 * MiB, metadata=GROUP_WIDE)  # across nodes: bytes per pipeline segment
    single_copy: str = field(default="auto", metadata=GROUP_WIDE)  # "auto", "0" (never) or "1" (every size)
    spin_us: float | None = None
    yield_us: float | None = None
    hostid: str | None = None


_PARSERS = {
    "shm_dir": ("SHMCOLL_SHM_DIR", str),
    "chunk_bytes": ("SHMCOLL_CHUNK_BYTES", parse_bytes),
    "small_bytes": ("SHMCOLL_SMALL_BYTES", parse_bytes),
    "p2p_bytes": ("SHMCOLL_P2P_BYTES", parse_bytes),
    "threads": ("SHMCOLL_THREADS", int),
    "thread_bytes": ("SHMCOLL_THREAD_BYTES", parse_bytes),
    "segment_bytes": ("SHMCOLL_SEGMENT_BYTES", parse_bytes),
    "single_copy": ("SHMCOLL_SINGLE_COPY", _single_copy),
    "spin_us": ("SHMCOLL_SPIN_US", float),
    "yield_us": ("SHMCOLL_YIELD_US", float),
    "hostid": ("SHMCOLL_HOSTID", str),
}


def read_settings(environ=os.environ) -> Settings:
    """Build Settings from the environment; a malformed value names its variable."""
    values = {}
    for setting in fields(Settings):
        name, parse = _PARSERS[setting.name]
        raw = environ.get(name)
        if raw is None or raw == "":
            continue
        try:
            values[setting.name] = parse(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not a valid value") from None
    settings = Settings(**values)
    if settings.chunk_bytes < 4 * KiB or settings.chunk_bytes % 64:
        raise ValueError(f"SHMCOLL_CHUNK_BYTES={settings.chunk_bytes} must be a multiple of 64, at least 4096")
    if settings.threads is not None and settings.threads < 1:
        raise ValueError(f"SHMCOLL_THREADS={settings.threads} must be at least 1")
    if settings.thread_bytes < 4 * KiB:
        raise ValueError(f"SHMCOLL_THREAD_BYTES={settings.thread_bytes} must be at least 4096")
    if settings.segment_bytes < 1 * KiB:
        raise ValueError(f"SHMCOLL_SEGMENT_BYTES={settings.segment_bytes} must be at least 1024")
    if settings.p2p_bytes < 1 * KiB or settings.p2p_bytes % 128:
        raise ValueError(f"SHMCOLL_P2P_BYTES={settings.p2p_bytes} must be a multiple of 128, at least 1024")
    return settings


def group_wide(settings: Settings) -> dict[str, int | str]:
    """The settings every rank of a group must share, by variable name."""
    return {_PARSERS[f.name][0]: getattr(settings, f.name) for f in fields(Settings) if f.metadata.get("group_wide")}


def with_group_wide(settings: Settings, values: dict[str, int]) -> Settings:
    """``settings`` with the group-wide ones replaced by ``values`` (as ``group_wide`` names them)."""
    names = {_PARSERS[f.name][0]: f.name for f in fields(Settings)}
    return replace(settings, **{names[variable]: value for variable, value in values.items()})


# Read elsewhere: SHMCOLL_LOG_LEVEL by shmcoll._logging (it configures logging, not Settings).
_OTHER_VARIABLES = ("SHMCOLL_LOG_LEVEL",)


def variables() -> dict[str, str | None]:
    """The SHMCOLL_* variables and their raw values in this process (for diagnostics)."""
    names = [name for name, _ in _PARSERS.values()] + list(_OTHER_VARIABLES)
    return {name: os.environ.get(name) for name in names}
