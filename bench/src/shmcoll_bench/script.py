"""The frame of the benchmark scripts in bench/ that run under torchrun: their common options, the groups they
compare, their results file and their end; each script keeps only what it measures.

Such a job's default group is shm's; it compares that with a ``new_group(backend="gloo")`` over the same ranks,
and makes its ranks agree (barriers, the slowest rank's times) on a third group, gloo's too, that no timed
call ever waits on.
"""
from __future__ import annotations

import argparse
import dataclasses
import os

import torch
import torch.distributed as dist

from shmcoll_bench import results


def parser(doc: str) -> argparse.ArgumentParser:
    """The script's parser, with its docstring's first paragraph as the description, ``--threads`` (for
    ``start``) and ``--json PATH``; the script adds its own options."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    # torchrun sets OMP_NUM_THREADS=1 where it is unset; bench/threads.sh sets it to the layout's threads.
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    p.add_argument("--threads", type=int, default=threads, help=f"torch threads per rank (default {threads}: "
                   "$OMP_NUM_THREADS, else 1)")
    p.add_argument("--json", metavar="PATH", help="write the results here")
    return p


def add_best_round_options(p: argparse.ArgumentParser, sizes: str) -> None:
    """The options of a script that reports each figure as its best round (shmcoll_bench.timing.best_round)."""
    p.add_argument("--sizes", default=sizes, help=f"message sizes, comma-separated (default {sizes})")
    p.add_argument("--rounds", type=int, default=5, help="rounds per figure, the best one counts (default 5)")
    p.add_argument("--iters-time", type=float, default=0.1, help="seconds of calls per round (default 0.1)")


@dataclasses.dataclass
class Job:
    """A benchmark job's ranks and groups (``start``)."""

    rank: int
    world: int
    groups: dict  # label -> group compared: "shm" (None: the default group) and "gloo"
    ctrl: dist.ProcessGroup  # the bookkeeping group (gloo), never timed


def start(threads: int) -> Job:
    """Set torch's threads per rank, then make the default (shm) group, the gloo group and the bookkeeping one."""
    torch.set_num_threads(threads)
    dist.init_process_group("shm")
    groups = {"shm": None, "gloo": dist.new_group(backend="gloo")}
    return Job(dist.get_rank(), dist.get_world_size(), groups, dist.new_group(backend="gloo"))


def slowest(values: list[float], ctrl: dist.ProcessGroup) -> list[float]:
    """Each value's maximum over the ranks: a collective lasts until its slowest rank is done."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctrl)
    return t.tolist()


def write_json(path: str | None, doc: dict) -> None:
    """Rank 0's results at --json's ``path``, if one was given, and a line that says where."""
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        results.save(doc, path)
        print(f"wrote {path}")


def finish(ctrl: dist.ProcessGroup, code: int = 0) -> int:
    """The job's exit status, once every rank is past rank 0's report (so that no rank tears the groups down
    while rank 0 still uses them) and the groups are gone."""
    dist.barrier(group=ctrl)
    dist.destroy_process_group()
    return code
