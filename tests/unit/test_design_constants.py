"""The sizes, limits and counts docs/DESIGN.md quotes, against the code's own constants.

Each figure is read from the sentence that quotes it (a pattern that matches exactly once in DESIGN, its
line breaks joined) and compared with the value the code uses, so that a change to either side alone fails
here. Measured figures (benchmark results, timings) are not constants of the code and are not checked.
"""
from __future__ import annotations

import os
import pathlib
import re
from types import SimpleNamespace

import pytest

from shmcoll import _merge, arena, collectives, descriptors, gloo_exit, lanes, single_copy, sparse, waits
from shmcoll._env import Settings
from shmcoll._logging import first_wait_warning
from shmcoll.algorithms import allreduce
from shmcoll.placement import node, single
from shmcoll.placement.across import alltoall, causes, network, pipeline
from shmcoll.placement.nodes import Nodes
from tests.ext_source import constant

REPO = pathlib.Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "DESIGN.md"
DEFAULTS = Settings()
CPUS = len(os.sched_getaffinity(0))
MiB = 1 << 20

_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "eight": 8}
_SCALES = {"B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
NUMBER = r"(\d+(?:\.\d+)?|" + "|".join(_WORDS) + ")"
SIZE = r"(\d+(?:\.\d+)? (?:bytes|B|KiB|MiB))"  # read as bytes
TIME = r"(\d+(?:\.\d+)? (?:us|ms|s))"  # read as nanoseconds


def design_text() -> str:
    """DESIGN with every run of white space (line breaks included) made one space."""
    return " ".join(DESIGN.read_text().split())


def value(quoted: str) -> float:
    """'512 KiB' -> bytes, '100 ms' -> nanoseconds, 'eight' -> 8, '2.5' -> 2.5."""
    number, _, unit = quoted.partition(" ")
    amount = _WORDS[number] if number in _WORDS else float(number)
    return amount * _SCALES[unit] if unit else amount


def quoted(pattern: str, text: str) -> tuple[str, ...]:
    """The groups of the one place in ``text`` that ``pattern`` matches."""
    found = [m.groups() for m in re.finditer(pattern, text)]
    assert len(found) == 1, f"docs/DESIGN.md matches {pattern!r} {len(found)} times, not once"
    return found[0]


def _least_ranks_under_small() -> int:
    """The fewest local ranks at which the default one-shot limit falls below SHMCOLL_SMALL_BYTES."""
    return next(ranks for ranks in range(1, 64)
                if allreduce.one_shot_limit(DEFAULTS.small_bytes, DEFAULTS.chunk_bytes, ranks) < DEFAULTS.small_bytes)


def _budgets(local_size: int) -> waits.Budgets:
    return waits.policy(DEFAULTS, local_size, across_nodes=False).inline


def _lanes_split() -> float:
    """The least message that runs on several lanes, in SHMCOLL_THREAD_BYTES."""
    split = lanes.Lanes(SimpleNamespace(lane_count=2, chunk_bytes=DEFAULTS.chunk_bytes), DEFAULTS.thread_bytes).split_bytes
    return split / DEFAULTS.thread_bytes


def _dtype_codes() -> int:
    """How many dtype codes a descriptor carries whole: those that come back from it as themselves."""
    names = descriptors._DTYPE_BY_CODE
    descriptors._DTYPE_BY_CODE = {code: f"code {code}" for code in range(1 << 8)}
    try:
        back = [code for code in range(1 << 8) if descriptors.fields(descriptors.descriptor(
            descriptors.ALLREDUCE, 1, code))[1].get("dtype") == f"code {code}"]
    finally:
        descriptors._DTYPE_BY_CODE = names
    assert back == list(range(len(back))), back
    return len(back)


# Settings' defaults (_env.Settings): the field, and the sentence that quotes its default.
DEFAULT_QUOTES = {
    "chunk_bytes": rf"\(buffers; the chunk is {SIZE} by default\)",
    "p2p_bytes": rf"`\+ L\^2 x SHMCOLL_P2P_BYTES` \(channels; {SIZE} by default\)",
    "small_bytes": rf"\(`SHMCOLL_SMALL_BYTES`, {SIZE} by default,",
    "thread_bytes": rf"`n = min\(T, bytes / SHMCOLL_THREAD_BYTES\)` \({SIZE} by default\)",
    "segment_bytes": rf"The default segment is {SIZE}:",
}

# Every other figure: what it is -> (the code's value or values, in the patterns' order; then the sentences
# that quote it). Sizes are bytes, durations nanoseconds.
QUOTES = {
    # waits.py, _logging.py
    "the wait slice": (lambda: waits.SLICE_NS, rf"A wait that outlasts its {TIME} slice",
                       rf"for at most one slice \({TIME}\)"),
    "the spin budget (alone, crowded)": (
        lambda: (_budgets(1).spin_ns, _budgets(CPUS + 1).spin_ns),
        rf"\(`SHMCOLL_SPIN_US`: {TIME}, {NUMBER} when local ranks outnumber cores\)"),
    "the yield budget (alone, crowded)": (
        lambda: (_budgets(1).yield_ns, _budgets(CPUS + 1).yield_ns),
        rf"\(`SHMCOLL_YIELD_US`: {TIME}, {TIME} when local ranks outnumber cores\)"),
    "the first slow-wait warning": (lambda: first_wait_warning(float("inf")) * 1e9,
                                    rf"slow \(a WARNING after {TIME} or a third of the timeout"),
    # arena.py, lanes.py
    "the arena's header": (lambda: arena.HEADER_BYTES, rf"into the header \({NUMBER} bytes\)"),
    "a control line": (lambda: arena.LINE_BYTES, rf"\*control line\* \({NUMBER} bytes per rank"),
    "a rank's table, in words (x L, + 1)": (
        lambda: (arena.table_words(2) - arena.table_words(1), 2 * arena.table_words(1) - arena.table_words(2)),
        r"two per rank of `(\d+)L \+ (\d+)` words"),
    "MAX_LANES": (lambda: arena.MAX_LANES, rf"two per channel, {NUMBER} per rank for lanes\)",
                  rf"its own control lines \({NUMBER} per rank are reserved\)",
                  rf"either way at most {NUMBER} \(`arena.MAX_LANES`"),
    "a lane's step": (lambda: arena.lane_bytes(DEFAULTS.chunk_bytes),
                      rf"\(`arena.lane_bytes`: a step of {SIZE} by default"),
    "the least message that splits, in SHMCOLL_THREAD_BYTES": (
        _lanes_split, r"whose message is at least `(\d+) x SHMCOLL_THREAD_BYTES` per rank"),
    "a lane's idle poll": (lambda: waits.LANE_IDLE_SPIN_NS,
                           rf"polls for the next job for {TIME} \(`waits.LANE_IDLE_SPIN_NS`",
                           rf"an idle lane thread polls for {TIME} at most"),
    # algorithms/allreduce.py, placement/node.py, single_copy.py
    "the one-shot limit's fall (/ L^2)": (lambda: allreduce.ONE_SHOT_RANKS_BYTES,
                                          rf"within one slot and within {SIZE} / L\^2 for L local ranks"),
    "the fewest ranks under the default one-shot limit": (
        _least_ranks_under_small, rf"with the defaults is less from {NUMBER} local ranks on"),
    "an asynchronous call tried inline on one node": (
        lambda: node.OneNode.async_try_bytes,
        rf"asynchronous of at\s+most `async_try_bytes` per rank \({SIZE} on one node\)"),
    "all_reduce's single-copy span, in MiB": (
        lambda: tuple(n / MiB for n in node.SINGLE_COPY_SPANS["all_reduce"]),
        r"in single copy's span \((\d+)-(\d+) MiB, see"),
    "single copy's read cost limit": (lambda: node.READ_COST_LIMIT,
                                      rf"where a read costs less than {NUMBER} copies \(`READ_COST_LIMIT`\)"),
    "single copy's probe (bytes, reads)": (
        lambda: (single_copy._PROBE_BYTES, single_copy._TIMED_READS),
        rf"reads of its next peer's {SIZE} probe against copies of its own \(the fastest of {NUMBER} each\)"),
    # placement/across/
    "pipeline.DEPTH": (lambda: pipeline.DEPTH, rf"with {NUMBER} network stages in flight \(`pipeline.DEPTH`\)"),
    "how long a rank waits to learn a failure's cause": (lambda: causes.LEARN_S * 1e9,
                                                          rf"waiting up to {TIME} \(`causes.LEARN_S`\)"),
    "EXCHANGE_NODES": (lambda: network.EXCHANGE_NODES,
                       rf"or a small one between up to {NUMBER} \(`network.EXCHANGE_NODES`\)",
                       rf"Up to {NUMBER} members each round is direct messages",
                       rf"\(up to {NUMBER} nodes: sent straight into its place",
                       rf"\(beyond {NUMBER} nodes, Gloo's barrier\)"),
    "all_to_all's header room (first, least)": (
        lambda: (alltoall._FIRST_ROOM, alltoall._FIRST_ROOM),
        rf"{SIZE} per rank at first and after a large call, else what the last small one's busiest rank sent, "
        rf"at least {SIZE};"),
    "all_to_all's tail": (lambda: alltoall.TAIL, rf"sends them {NUMBER} bytes short, which a random tail",
                          rf"with a random {NUMBER}-byte tail written at the end of each buffer",
                          rf"sends stand-ins {NUMBER} bytes short of the agreed sizes"),
    "all_to_all's padding (under, to)": (lambda: (alltoall.TAIL, alltoall.TAIL),
                                         rf"blocks under {NUMBER} bytes travel padded to {NUMBER}\)"),
    # sparse.py, _ext/merge.pyx, _ext/pool.pyx, _ext/shmcoll_introsort.h
    "where torch's sort changes": (lambda: _merge.SORTS_AS_TORCH_BELOW,
                                   rf"Below {NUMBER} keys torch's sort is libstdc\+\+'s",
                                   rf"from {NUMBER} keys torch switches to fbgemm's radix sort"),
    "the sort's partition block": (lambda: constant("shmcoll_introsort.h", "SHMCOLL_INTROSORT_BLOCK"),
                                   rf"finds the elements to swap a block of {NUMBER} at a time"),
    "the prefetch distance": (lambda: constant("merge.pyx", "PREFETCH_AHEAD"),
                              rf"each row is prefetched {NUMBER} rows ahead"),
    "the indices' most room": (lambda: sparse._room_after([(1 << 40, 1)]) * 8,
                               rf"the last call's largest part and a quarter \(.*?\), at most {SIZE};"),
    "Buffers.KEEP_BYTES": (lambda: sparse.Buffers.KEEP_BYTES, rf"up to {SIZE} each \(`Buffers.KEEP_BYTES`"),
    "the sums' pool (blocks, bytes)": (
        lambda: (constant("pool.pyx", "MAX_BLOCKS"), sparse.Buffers.KEEP_BYTES),
        rf"The pool lends at most {NUMBER} blocks, {SIZE} in all"),
    # collectives.py, gloo_exit.py, descriptors.py
    "abort's grace": (lambda: collectives._ABORT_GRACE_S * 1e9,
                      rf"wait \({TIME} at most\) for the running collective to raise"),
    "the exit's wait for Gloo": (lambda: gloo_exit.WAIT_S * 1e9,
                                 rf"\(read from `/proc/self/task/\*/syscall`\), {TIME} at most"),
    "the dtype codes a descriptor holds": (_dtype_codes, rf"an unused descriptor code below {NUMBER}"),
}
CASES = [(f"Settings.{field}", lambda field=field: getattr(DEFAULTS, field), pattern)
         for field, pattern in DEFAULT_QUOTES.items()]
CASES += [(what if len(patterns) == 1 else f"{what}, quote {n + 1}", code, pattern)
          for what, (code, *patterns) in QUOTES.items() for n, pattern in enumerate(patterns)]


def check(what: str, code, pattern: str, text: str) -> str | None:
    """None where DESIGN's figures for ``what`` are the code's, else what differs."""
    said = tuple(value(group) for group in quoted(pattern, text))
    expected = code()
    expected = tuple(expected) if isinstance(expected, tuple) else (expected,)
    if said != expected:
        return f"docs/DESIGN.md quotes {what} as {said}, the code has {expected} (sizes in bytes, durations in ns)"
    return None


@pytest.mark.parametrize("what, code, pattern", CASES, ids=[c[0] for c in CASES])
def test_design_quotes_the_code(what, code, pattern):
    problem = check(what, code, pattern, design_text())
    assert problem is None, problem


def test_a_third_of_the_timeout_warns_first():
    assert "a WARNING after 10 s or a third of the timeout" in design_text()
    assert first_wait_warning(3.0) == 1.0


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


def _mib(ranks: int, threads: int = 1) -> float:
    return arena.layout(ranks, DEFAULTS.chunk_bytes, DEFAULTS.p2p_bytes, threads).total / MiB


def _close(said: str, actual: float) -> bool:
    """Whether ``said`` is ``actual`` rounded to the decimals it shows."""
    decimals = len(said.partition(".")[2])
    return abs(float(said) - actual) <= 0.5 * 10 ** -decimals + 1e-9


def test_the_arena_sizes_are_the_layout_s():
    text = design_text()
    small, small_ranks, large, large_ranks = quoted(
        r"rounded up to a cache line\): (\d+(?:\.\d+)?) KiB at (\d+) ranks, (\d+(?:\.\d+)?) KiB at (\d+),", text)
    for said, ranks in ((small, int(small_ranks)), (large, int(large_ranks))):
        layout = arena.layout(ranks, DEFAULTS.chunk_bytes, DEFAULTS.p2p_bytes)
        lines_and_tables = layout.tables + 2 * ranks * arena.table_bytes(ranks)  # from the header on
        assert _close(said, lines_and_tables / 1024), (said, ranks, lines_and_tables / 1024)
    one_thread, = quoted(r"With the defaults and one thread per rank \(torchrun's default\): (.*?) per group", text)
    sizes = re.findall(r"(\d+) ranks (\d+\.\d) MiB", one_thread)
    assert len(sizes) == 4, one_thread
    for ranks, said in sizes:
        assert _close(said, _mib(int(ranks))), (ranks, said, _mib(int(ranks)))
    with_lanes, = quoted(r"With lanes: (.*?) \(the 8-rank mesh", text)
    sizes = re.findall(r"(\d+) x (\d+)(?: \(ranks x threads\))? (\d+\.\d) MiB", with_lanes)
    assert len(sizes) == 3, with_lanes
    for ranks, threads, said in sizes:
        assert _close(said, _mib(int(ranks), int(threads))), (ranks, threads, said)


def test_the_mesh_s_arenas():
    """An 8-rank job with a 2 x 4 DeviceMesh: the world group, two groups of 4 and four of 2."""
    text = design_text()
    mesh = lambda threads: _mib(8, threads) + 2 * _mib(4, threads) + 4 * _mib(2, threads)
    one, = quoted(r"two groups of 4 and four of 2, (\d+) MiB of `/dev/shm`", text)
    two, = quoted(r"the 8-rank mesh at 2 threads: (\d+) MiB", text)
    kept, = quoted(r"`SHMCOLL_THREADS=1` keeps it at (\d+)\)", text)
    assert _close(one, mesh(1)) and _close(kept, mesh(1)), (one, kept, mesh(1))
    assert _close(two, mesh(2)), (two, mesh(2))


def test_a_change_on_either_side_alone_fails():
    """DESIGN's chunk changed alone, or the code's slice alone, is a difference; a sentence reworded so that
    its pattern no longer finds it is one too."""
    text = design_text()
    chunk, pattern = (lambda: DEFAULTS.chunk_bytes), DEFAULT_QUOTES["chunk_bytes"]
    assert check("the chunk", chunk, pattern, text) is None
    changed = text.replace("the chunk is 512 KiB by default", "the chunk is 256 KiB by default")
    assert changed != text and check("the chunk", chunk, pattern, changed) is not None
    _, slice_pattern, _ = QUOTES["the wait slice"]
    assert check("the slice", lambda: waits.SLICE_NS // 2, slice_pattern, text) is not None
    with pytest.raises(AssertionError, match="0 times"):
        check("the slice", lambda: waits.SLICE_NS, slice_pattern, text.replace("outlasts its 100 ms", "outlasts a"))


def test_the_group_wide_settings_are_those_every_document_lists():
    """_env marks which settings every rank of a group shares; DESIGN lists them, README's variable table
    says "yes" in its last column for exactly those."""
    from shmcoll._env import group_wide

    variables = set(group_wide(DEFAULTS))
    names = {"SHMCOLL_CHUNK_BYTES": "chunk", "SHMCOLL_P2P_BYTES": "p2p", "SHMCOLL_SMALL_BYTES": "small",
             "SHMCOLL_THREAD_BYTES": "thread", "SHMCOLL_SEGMENT_BYTES": "segment", "SHMCOLL_SINGLE_COPY": "single copy"}
    listed, = quoted(r"\(`_env.GROUP_WIDE`: ([a-z0-9 ,]+?),\s+single copy\)", design_text())
    design = {word.strip() for word in listed.replace(" and ", ", ").replace("bytes", "").split(",")} | {"single copy"}
    assert design == {names[v] for v in variables}, f"DESIGN lists {sorted(design)}; _env marks {sorted(variables)}"
    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    yes = set(re.findall(r"^\| `(SHMCOLL_\w+)` \|.*\| yes[^|]*\|$", readme, re.M))
    assert yes == variables, f"README says yes for {sorted(yes)}; _env marks {sorted(variables)}"
