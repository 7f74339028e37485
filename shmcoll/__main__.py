"""``python -m shmcoll``: diagnostics and maintenance commands.

  info   versions, entry point, CPUs, /dev/shm, kernel cache, SHMCOLL_* settings
  warm   compile (or load from cache) every reduction kernel ahead of time
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def _warm(_args) -> int:
    """Compile (or load from Numba's on-disk cache) every reduction kernel."""
    from shmcoll import kernels

    start = time.perf_counter()
    kernels.warm()
    print(f"shmcoll: {len(kernels.DTYPES)} reduction kernels ready in {time.perf_counter() - start:.1f} s")
    return 0


def _kernel_cache() -> tuple[str, bool]:
    """Where Numba caches shmcoll's kernels, and whether the cache holds them."""
    import glob

    from shmcoll import kernels

    folder = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(os.path.dirname(kernels.__file__), "__pycache__")
    return folder, bool(glob.glob(os.path.join(folder, "**", "kernels.*.nbi"), recursive=True))


def _info(_args) -> int:
    """Print what shmcoll sees on this machine (no torchrun needed)."""
    from importlib.metadata import entry_points, version

    import torch
    import torch.distributed as dist

    from shmcoll import _env, _segment, topology

    settings = _env.read_settings()
    rows = [
        ("shmcoll", version("shmcoll")),
        ("torch", torch.__version__),
        ("numba", version("numba")),
        ("python", sys.version.split()[0]),
        ("torch entry point", ", ".join(f"{e.name} -> {e.value}" for e in entry_points(group="torch.backends")
                                        if e.name == "shmcoll") or "missing (reinstall shmcoll)"),
        ("'shm' registered", str("shm" in dist.Backend.backend_list)),
        ("CPUs usable", f"{len(os.sched_getaffinity(0))} of {os.cpu_count()}"),
        ("host identity", topology.host_identity(settings.hostid)),
    ]
    try:
        free, total = _segment.free_bytes(settings.shm_dir), _segment.total_bytes(settings.shm_dir)
        rows.append((f"{settings.shm_dir}", f"{free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB"))
    except OSError as error:
        rows.append((settings.shm_dir, f"unusable: {error}"))
    from shmcoll.arena import layout

    for ranks in (2, 8, 16):
        rows.append((f"arena for {ranks} local ranks",
                     f"{layout(ranks, settings.chunk_bytes, settings.p2p_bytes).total / 2**20:.1f} MiB"))
    folder, warm = _kernel_cache()
    rows.append(("kernel cache", f"{folder} ({'warm' if warm else 'cold: first group compiles, ~10 s'})"))
    for field in ("chunk_bytes", "small_bytes", "p2p_bytes", "spin_us", "yield_us"):
        value = getattr(settings, field)
        rows.append((f"  {field}", "auto" if value is None else str(value)))
    for name, raw in _env.variables().items():
        if raw is not None:
            rows.append((f"  ${name}", raw))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shmcoll", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help=_info.__doc__).set_defaults(run=_info)
    commands.add_parser("warm", help=_warm.__doc__).set_defaults(run=_warm)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
