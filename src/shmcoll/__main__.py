"""``python -m shmcoll``: diagnostics and maintenance commands.

  info   versions (torch against the tested releases, and every fallback for torch's internals), entry point,
         CPUs, /dev/shm, kernel library, SHMCOLL_* settings, the constants docs/DESIGN.md names
  warm   compile the reduction kernels into their native library ahead of time

The benchmarks are a package of their own (bench/ in the repository: ``python -m shmcoll_bench``).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time


def _warm(_args) -> int:
    """Build (or find) the native library of reduction kernels, so no job compiles them."""
    from shmcoll import kernel_abi, kernel_library

    start = time.perf_counter()
    kernel_library.warm(retry=True)  # asked for explicitly: try again even if an earlier build failed
    where = kernel_library.loaded_from() or "Numba's JIT (no native library could be built; see INFO log)"
    print(f"shmcoll: {len(kernel_abi.DTYPES)} reduction kernels ready in {time.perf_counter() - start:.1f} s: {where}")
    return 0


def _info(_args) -> int:
    """Print what shmcoll sees on this machine (no torchrun needed)."""
    from importlib.metadata import entry_points, version

    import torch
    import torch.distributed as dist

    from shmcoll import _env, _registration, _segment, _torch_compat, kernel_library, topology, torch_internals
    from shmcoll import torch_releases

    settings = _env.read_settings()
    tested = f"tested on {', '.join(torch_releases.RELEASES)}"
    rows = [
        ("shmcoll", version("shmcoll")),
        ("torch", f"{torch.__version__} ({_torch_compat.untested() or tested})"),
        *_internals_rows(torch_internals.results(_registration.BACKEND_NAME, every=True)),
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
    from shmcoll.lanes import capped
    from shmcoll.placement import lanes_wanted

    cpus = len(os.sched_getaffinity(0))
    for ranks in (2, 8, 16):
        # lanes as a node of that many unpinned ranks here would agree on them (lanes.agree)
        lanes = capped(lanes_wanted(settings), settings.threads is not None, cpus, ranks)
        size = layout(ranks, settings.chunk_bytes, settings.p2p_bytes, lanes).total
        rows.append((f"arena for {ranks} local ranks", f"{size / 2**20:.1f} MiB ({lanes} lane(s) each)"))
    library = kernel_library.library_path()
    failed = kernel_library.earlier_failure(library)
    if os.path.exists(library):
        state = "warm"
    elif failed is not None:
        state = f"a build failed: {failed}; jobs use Numba's JIT until `python -m shmcoll warm` succeeds"
    else:
        state = "cold: first group compiles, ~10 s"
    rows.append(("kernel library", f"{library} ({state})"))
    rows.append(("single copy", _single_copy_state(settings)))
    rows.append(("streaming stores", _streaming_state()))
    # Every setting in effect (README's table gives some defaults only by what they do): the directory and
    # host identity have rows of their own above.
    for field in dataclasses.fields(settings):
        if field.name not in ("shm_dir", "hostid"):
            value = getattr(settings, field.name)
            rows.append((f"  {field.name}", "auto" if value is None else str(value)))
    for name, raw in _env.variables().items():
        if raw is not None:
            rows.append((f"  ${name}", raw))
    rows += _constant_rows()
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


# The constants docs/DESIGN.md names instead of quoting their values (tests/unit/test_design_constants.py holds
# the two to each other): "module.NAME" as DESIGN writes it, and where the module lies under shmcoll.
NAMED_CONSTANTS = {
    "_env.GROUP_WIDE": "_env", "_logging.WARN_AFTER_S": "_logging", "_merge.SORTS_AS_TORCH_BELOW": "_merge",
    "allreduce.ONE_SHOT_RANKS_BYTES": "algorithms.allreduce", "allreduce.ONE_SHOT_STEPS_RANKS": "algorithms.allreduce",
    "alltoall.TAIL": "placement.across.alltoall", "alltoall.FIRST_ROOM": "placement.across.alltoall",
    "arena.HEADER_BYTES": "arena", "arena.LINE_BYTES": "arena", "arena.MAX_LANES": "arena",
    "causes.LEARN_S": "placement.across.causes", "collectives.ABORT_GRACE_S": "collectives",
    "descriptors.KIND_NAMES": "descriptors", "flat.PLAN_TAG": "placement.flat", "gloo_exit.WAIT_S": "gloo_exit",
    "kernel_abi.DTYPES": "kernel_abi", "kernel_abi.DTYPE_TABLE": "kernel_abi",
    "network.EXCHANGE_NODES": "placement.across.network", "node.READ_COST_LIMIT": "placement.node",
    "node.SINGLE_COPY_SPANS": "placement.node", "p2p.MOVE_SLICE_NS": "p2p", "pipeline.DEPTH": "placement.across.pipeline",
    "single_copy.PROBE_BYTES": "single_copy", "single_copy.TIMED_READS": "single_copy",
    "sparse.Buffers.KEEP_BYTES": "sparse", "sparse.ROOM_MAX": "sparse", "torch_internals.ITEMS": "torch_internals",
    "torch_releases.RELEASES": "torch_releases", "waits.LANE_IDLE_SPIN_NS": "waits", "waits.SLICE_NS": "waits",
}


def named_constant(name: str):
    """The value of ``name`` (a key of NAMED_CONSTANTS): its module imported, then each attribute after the first
    dot read in turn; ImportError or AttributeError where the code no longer has it."""
    import importlib

    value = importlib.import_module(f"shmcoll.{NAMED_CONSTANTS[name]}")
    for attribute in name.split(".")[1:]:
        value = getattr(value, attribute)
    return value


def _constant_rows() -> list[tuple[str, str]]:
    """One row per constant DESIGN names; long values (tables) by their length alone."""
    rows = [("constants", "named in docs/DESIGN.md")]
    for name in NAMED_CONSTANTS:
        value = named_constant(name)
        text = repr(value)
        rows.append((f"  {name}", text if len(text) <= 100 else f"{type(value).__name__} of {len(value)}"))
    return rows


def _streaming_state() -> str:
    """Which all-gathers write their output with streaming stores here (shmcoll.streaming)."""
    from shmcoll import streaming

    cache = streaming.last_level_cache_bytes()
    if cache <= 0:
        return "never (the last-level cache's size is unknown)"
    least = ", ".join(f"{streaming.least_output_bytes(ranks, cache) / 2**20:.1f} MiB at {ranks}" for ranks in (2, 4, 8))
    return f"last-level cache {cache / 2**20:.0f} MiB: all-gathers of an output per rank from {least} local ranks"


def _internals_rows(answers) -> list[tuple[str, str]]:
    """What shm takes from torch's internals (torch_internals): one row if all is as shm takes it, else one per
    item that falls back or has changed."""
    different = [(item, answer) for item, answer in answers if answer is not None]
    if not different:
        return [("torch internals", f"as shmcoll takes them ({len(answers)} checked)")]
    return [("torch internals", f"{len(different)} of {len(answers)} differ from what shmcoll takes:"),
            *(("  fallback" if isinstance(answer, str) else "  CHANGED", f"{item.takes}: {answer}")
              for item, answer in different)]


def _single_copy_state(settings) -> str:
    """What a group of ranks started like this process would use inside a node, and why."""
    from shmcoll import single_copy

    if settings.single_copy == "0":
        return "off (SHMCOLL_SINGLE_COPY=0): large collectives copy through shared memory"
    scope = single_copy.yama_scope()
    if scope == 1:  # a child may not read its parent; sibling ranks name their launcher as tracer
        return ("allowed if the ranks of a node share a parent (Yama's ptrace_scope is 1: each names it with "
                "PR_SET_PTRACER); the group probes it at creation")
    from shmcoll.placement.node import single_copy_spans

    verdict = single_copy.self_check()
    if verdict.refused:
        return f"refused ({verdict.refused}): large collectives copy through shared memory"
    spans = single_copy_spans(verdict, settings.single_copy)
    used = ("every collective at every size (SHMCOLL_SINGLE_COPY=1)" if settings.single_copy == "1" else
            ", ".join(spans) + " in their measured spans (docs/DESIGN.md, 'Single copy')" if spans else
            "not used, as the copy path is faster where reads cost two copies or more")
    return (f"allowed (a child process read this one's memory; a read costs {verdict.read_cost:.1f} copies "
            f"here): {used}")


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
