"""The constants docs/DESIGN.md names, against the code: every ``module.NAME`` it writes exists.

DESIGN names a constant (`waits.SLICE_NS`) instead of quoting its value, so rewording a sentence or changing
a value breaks nothing here; renaming or removing a constant that DESIGN names does. Each name must also be
one ``python -m shmcoll info`` prints (``shmcoll.__main__.NAMED_CONSTANTS``, where the module behind each
short name is given), and info must run and print them.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from shmcoll import arena, lanes
from shmcoll.__main__ import NAMED_CONSTANTS, named_constant
from shmcoll._env import Settings
from shmcoll.algorithms import allreduce
from shmcoll.placement import node, single
from shmcoll.placement.nodes import Nodes

REPO = pathlib.Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "DESIGN.md"
DEFAULTS = Settings()
# `module.NAME` or `module.Class.NAME` in backticks: NAME upper case, a leading underscore allowed.
NAMED = re.compile(r"`((?:[A-Za-z_]\w*\.)+_?[A-Z][A-Z0-9_]*)`")
NOT_OURS = ("distributed_c10d.", "dist.")  # torch's: named where DESIGN says what shm writes into it or reads of it


def design_text() -> str:
    """DESIGN with every run of white space (line breaks included) made one space."""
    return " ".join(DESIGN.read_text().split())


def named_in(text: str) -> set[str]:
    return {name for name in NAMED.findall(text) if not name.startswith(NOT_OURS)}


def unresolved(names) -> list[str]:
    """The names that info does not list, or whose module or attribute the code lacks."""
    problems = []
    for name in sorted(names):
        if name not in NAMED_CONSTANTS:
            problems.append(f"{name}: not in shmcoll.__main__.NAMED_CONSTANTS")
            continue
        try:
            named_constant(name)
        except (ImportError, AttributeError) as error:
            problems.append(f"{name}: {error}")
    return problems


def test_design_names_only_constants_the_code_has():
    names = named_in(design_text())
    assert len(names) >= 20, sorted(names)  # the pattern still finds them
    problems = unresolved(names)
    assert not problems, "docs/DESIGN.md names constants the code lacks:\n" + "\n".join(problems)


def test_a_made_up_name_fails():
    """A name DESIGN might carry that the code lacks, listed or not, is reported."""
    assert unresolved({"waits.SLICE_NS"}) == []
    text = design_text().replace("`waits.SLICE_NS`", "`waits.NO_SUCH_SLICE_NS`", 1)
    assert "waits.NO_SUCH_SLICE_NS" in named_in(text)
    assert unresolved(named_in(text)) == ["waits.NO_SUCH_SLICE_NS: not in shmcoll.__main__.NAMED_CONSTANTS"]
    NAMED_CONSTANTS["waits.NO_SUCH_SLICE_NS"] = "waits"
    try:
        (problem,) = unresolved({"waits.NO_SUCH_SLICE_NS"})
        assert "NO_SUCH_SLICE_NS" in problem, problem
    finally:
        del NAMED_CONSTANTS["waits.NO_SUCH_SLICE_NS"]


def test_info_prints_every_named_constant():
    """``python -m shmcoll info`` runs (no torchrun) and prints each constant with its value."""
    out = subprocess.run([sys.executable, "-m", "shmcoll", "info"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split(None, 1)[1] for line in out.stdout.splitlines() if line.startswith("  ")
            and len(line.split()) > 1}
    for name in NAMED_CONSTANTS:
        assert name in rows, (name, out.stdout)
    assert rows["waits.SLICE_NS"] == repr(named_constant("waits.SLICE_NS"))


def test_async_inline_on_one_rank_only():
    assert "the placement's `async_inline` says: on a single rank, not on one node, not across nodes" in design_text()
    assert not node.OneNode.async_inline and not Nodes.async_inline and single.SingleRank.async_inline


def test_the_one_shot_limit_is_within_one_slot():
    assert "within one slot and within" in design_text()
    assert allreduce.one_shot_limit(1 << 30, 4096, 2) == 4096  # the smallest slot SHMCOLL_CHUNK_BYTES allows


@pytest.mark.parametrize("small, chunk, thread_bytes", [
    (DEFAULTS.small_bytes, DEFAULTS.chunk_bytes, DEFAULTS.thread_bytes),
    (1 << 30, 4096, 4096), (1 << 30, 65536, 16384), (8192, 1 << 20, 4096), (1 << 20, 1 << 20, 4096)])
def test_every_one_shot_over_lanes_fits_its_slots(small, chunk, thread_bytes):
    """Every all-reduce up to the one-shot limit fits the slots it runs in: one slot of the arena's on one
    lane, each lane's stretch (as _schedules.Pool.start cuts it) in that lane's slot on several."""
    for ranks in (2, 3, 4, 8, 16):
        for count in (2, 3, 4, 8, 16):
            pool = lanes.Lanes(SimpleNamespace(lane_count=count, chunk_bytes=chunk), thread_bytes)
            limit = allreduce.one_shot_limit(small, chunk, ranks, count, pool.split_bytes, pool.share_bytes)
            for nbytes in range(1, limit + 1, 61):
                n = pool.for_bytes(nbytes)
                if n == 1:
                    assert nbytes <= chunk, (ranks, count, nbytes)
                    continue
                cuts = [nbytes * j // n // lanes.ALIGN_BYTES * lanes.ALIGN_BYTES for j in range(n)] + [nbytes]
                assert max(b - a for a, b in zip(cuts, cuts[1:])) <= arena.lane_bytes(chunk), (ranks, count, nbytes)
    pool = lanes.Lanes(SimpleNamespace(lane_count=8, chunk_bytes=DEFAULTS.chunk_bytes), DEFAULTS.thread_bytes)
    for ranks in (2, 4, 8, 16):  # with the defaults, lanes leave the limit as it is on one thread
        assert allreduce.one_shot_limit(DEFAULTS.small_bytes, DEFAULTS.chunk_bytes, ranks, 8, pool.split_bytes,
                                        pool.share_bytes) == allreduce.one_shot_limit(DEFAULTS.small_bytes,
                                                                                      DEFAULTS.chunk_bytes, ranks)


def test_the_one_shot_cap_grows_with_the_lanes_and_falls_with_the_ranks():
    """A one-shot split over the lanes divides its reads among them: with SHMCOLL_SMALL_BYTES out of the way, the
    limit at T lanes is T times one thread's cap (1 MiB / L^2) where the lanes' slots hold it, and falls with the
    ranks at every lane count."""
    for count in (1, 2, 4, 8):
        pool = lanes.Lanes(SimpleNamespace(lane_count=count, chunk_bytes=1 << 20), 16 << 10)
        limits = [allreduce.one_shot_limit(1 << 30, 1 << 20, ranks, count, pool.split_bytes, pool.share_bytes)
                  for ranks in (2, 3, 4)]
        assert limits == [count * (allreduce.ONE_SHOT_RANKS_BYTES // (ranks * ranks)) for ranks in (2, 3, 4)], limits


def test_the_group_wide_settings_are_those_every_document_lists():
    """_env marks which settings every rank of a group shares; DESIGN lists them, README's variable table
    says "yes" in its last column for exactly those."""
    from shmcoll._env import group_wide

    variables = set(group_wide(DEFAULTS))
    names = {"SHMCOLL_CHUNK_BYTES": "chunk", "SHMCOLL_P2P_BYTES": "p2p", "SHMCOLL_SMALL_BYTES": "small",
             "SHMCOLL_THREAD_BYTES": "thread", "SHMCOLL_SEGMENT_BYTES": "segment", "SHMCOLL_SINGLE_COPY": "single copy"}
    (listed,) = re.findall(r"\(`_env.GROUP_WIDE`: ([a-z0-9 ,]+?),\s+single copy\)", design_text())
    design = {word.strip() for word in listed.replace(" and ", ", ").replace("bytes", "").split(",")} | {"single copy"}
    assert design == {names[v] for v in variables}, f"DESIGN lists {sorted(design)}; _env marks {sorted(variables)}"
    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    yes = set(re.findall(r"^\| `(SHMCOLL_\w+)` \|.*\| yes[^|]*\|$", readme, re.M))
    assert yes == variables, f"README says yes for {sorted(yes)}; _env marks {sorted(variables)}"
