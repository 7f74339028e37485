"""Groups spanning several nodes, simulated on one machine with a SHMCOLL_HOSTID per rank.

Hierarchical plans (node arena + Gloo rails) and the flat Gloo fallback are
checked against local references: equal nodes (2 x 2, contiguous and
interleaved ranks), uneven nodes (1 + 2 + 1), and two torchrun invocations
with --nnodes 2. A one-node job must create no Gloo group at all.

Also: a rank that cannot map its node's arena runs as a node of its own; a rank
of another node dying mid-collective makes the group refuse every later call;
subgroups across nodes and inside one node.
"""
import shutil
import signal
import subprocess

import pytest

from tests import movement_scenarios, reduction_scenarios
from tests.harness import assert_job_passes, shm_entries, spawn, torchrun_nodes
from tests.multinode import SMALL_CHUNKS, SUBGROUPS
from tests.multinode_faults import GROUP_TIMEOUT_S


def _hosts(rank_nodes):
    return lambda rank: {"SHMCOLL_HOSTID": f"node{rank_nodes[rank]}"}


@pytest.mark.parametrize("rank_nodes, nodes", [
    ([0, 0, 1, 1], [[0, 1], [2, 3]]),  # 2 nodes x 2 ranks
    ([0, 1, 0, 1], [[0, 2], [1, 3]]),  # the same, ranks interleaved across nodes
    ([0, 1, 1, 2], [[0], [1, 2], [3]]),  # 3 uneven nodes: 1 + 2 + 1
    ([0, 0, 0, 1], [[0, 1, 2], [3]]),  # 3 + 1
    ([0, 1, 2], [[0], [1], [2]]),  # 3 nodes of one rank: no arena, every rank a leader
], ids=["2x2", "2x2-interleaved", "1+2+1", "3+1", "3x1"])
def test_multinode_matrix(rank_nodes, nodes):
    before = shm_entries()
    result = spawn("tests.multinode:matrix", len(rank_nodes), env=SMALL_CHUNKS, args=["5003"],
                   rank_env=_hosts(rank_nodes), timeout=90)
    assert_job_passes(result, min_cases=206 if len(rank_nodes) == 4 else 182)
    for report in result.reports:
        assert report["hierarchical"] and report["flat_gloo"], report
        assert report["nodes"] == nodes
    assert shm_entries() - before == set()


# Even nodes, uneven ones, nodes of one rank, three nodes (a link of three members: the partials' two-round
# form), and more nodes than EXCHANGE_NODES (Gloo's all_to_all and all_gather carry the partials; a few dtypes,
# 9 ranks on 2 cores being slow).
LAYOUTS = {"1+1": [0, 1], "2+2": [0, 0, 1, 1], "2+1": [0, 0, 1], "3+1": [0, 0, 0, 1], "3x1": [0, 1, 2],
           "1+2+1": [0, 1, 1, 2], "9x1": list(range(9))}
FEW_DTYPES = {"9x1": "float32,int16,bool,complex64"}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_reduction_across_nodes(layout):
    """Every reduce op with every dtype it accepts, on all_reduce, reduce (every root), reduce_scatter_tensor and
    reduce_scatter, at sizes that take each plan, against local references; refused ones raise alike and leave
    the group usable."""
    rank_nodes = LAYOUTS[layout]
    small, segment = int(SMALL_CHUNKS["SHMCOLL_SMALL_BYTES"]), int(SMALL_CHUNKS["SHMCOLL_SEGMENT_BYTES"])
    dtypes = FEW_DTYPES.get(layout, "")
    result = spawn("tests.reduction_scenarios:every_reduction", len(rank_nodes), env=SMALL_CHUNKS,
                   args=[str(small), str(segment), dtypes], rank_env=_hosts(rank_nodes), timeout=300)
    assert_job_passes(result, min_cases=len(reduction_scenarios.planned(len(rank_nodes), small, segment, dtypes)))


@pytest.mark.parametrize("layout", ["2+2", "1+2+1", "9x1"])
def test_every_dtype_moved_across_nodes(layout):
    """Every data-movement collective with every dtype: Gloo's own collectives refuse some unless given bytes."""
    rank_nodes = LAYOUTS[layout]
    big = "3001" if len(rank_nodes) < 9 else "31"
    result = spawn("tests.movement_scenarios:every_dtype_moved", len(rank_nodes), env=SMALL_CHUNKS,
                   args=[big], rank_env=_hosts(rank_nodes), timeout=300)
    assert_job_passes(result, min_cases=movement_scenarios.every_dtype_moved_cases(len(rank_nodes), big))


@pytest.mark.parametrize("rank_nodes", [[0, 0, 1, 1], [0, 0, 1]], ids=["2x2", "2+1"])
def test_sparse_all_reduce_across_nodes_matches_gloo(rank_nodes):
    """The sparse all-reduce's all-gathers over the hierarchical plan (2x2) and the flat Gloo one (2+1)."""
    before = shm_entries()
    result = spawn("tests.library_scenarios:sparse", len(rank_nodes), env=SMALL_CHUNKS,
                   rank_env=_hosts(rank_nodes), timeout=90)
    assert_job_passes(result, min_cases=14)
    assert shm_entries() - before == set()


@pytest.mark.parametrize("rank_nodes", [[0, 0, 1, 1], [0, 1, 1], [0, 1, 1, 2]], ids=["2x2", "1+2", "1+2+1"])
def test_all_to_all_of_changing_sizes_across_nodes(rank_nodes):
    """The default small size: all_to_alls that ride in the leaders' headers, follow them, or go straight;
    after a large one, sizes that disagree either way raise the same error on every rank."""
    result = spawn("tests.multinode:alltoall_sizes", len(rank_nodes), rank_env=_hosts(rank_nodes), timeout=90)
    assert_job_passes(result, min_cases=32)


def test_one_node_creates_no_gloo_group():
    result = spawn("tests.multinode:layout_only", 2, env={"SHMCOLL_HOSTID": "same-node"}, timeout=60)
    assert_job_passes(result, min_cases=1)
    for report in result.reports:
        assert not report["hierarchical"] and not report["flat_gloo"], report


def test_torchrun_two_nodes():
    """Two torchrun invocations (--nnodes 2, static rendezvous), each its own SHMCOLL_HOSTID."""
    before = shm_entries()
    result = torchrun_nodes("tests.multinode:matrix", ["5003"], nnodes=2, nproc=2,
                            node_env=lambda node: {**SMALL_CHUNKS, "SHMCOLL_HOSTID": f"torchrun-node{node}"})
    assert_job_passes(result, min_cases=206)
    for report in result.reports:
        assert report["hierarchical"] and report["nodes"] == [[0, 1], [2, 3]], report
    assert shm_entries() - before == set()


def test_torchrun_three_uneven_nodes():
    """Three torchrun invocations with 1, 2 and 1 ranks (--nnodes 3), each its own SHMCOLL_HOSTID."""
    before = shm_entries()
    result = torchrun_nodes("tests.multinode:matrix", ["5003"], nnodes=3, nproc=[1, 2, 1],
                            node_env=lambda node: {**SMALL_CHUNKS, "SHMCOLL_HOSTID": f"torchrun-node{node}"},
                            timeout=120)
    assert_job_passes(result, min_cases=206)
    for report in result.reports:
        assert report["hierarchical"] and report["nodes"] == [[0], [1, 2], [3]], report
    assert shm_entries() - before == set()


# -- a rank that cannot map its node's arena -------------------------------------------

def test_rank_that_cannot_map_its_arena_runs_as_a_node_of_its_own():
    """2 x 2, rank 1 fails to map the arena rank 0 created (test-only hook): nodes [0], [1], [2, 3]."""
    before = shm_entries()
    result = spawn("tests.multinode:matrix", 4, env={**SMALL_CHUNKS, "TEST_FAIL_ATTACH": "1"}, args=["5003"],
                   rank_env=_hosts([0, 0, 1, 1]), timeout=90)
    assert_job_passes(result, min_cases=206)
    for report in result.reports:
        assert report["hierarchical"] and report["nodes"] == [[0], [1], [2, 3]], report
    for rank in (0, 1):  # the rank itself and rank 0 say so
        assert "rank 1 cannot map the shm arena of its node (ranks 0, 1)" in result.outputs[rank], \
            result.outputs[rank]
        assert "TEST_FAIL_ATTACH" in result.outputs[rank]
    assert "cannot map" not in result.outputs[2] + result.outputs[3]
    assert shm_entries() - before == set()


def _pid_namespace_prefix() -> list[str]:
    """``unshare`` starting a rank in a PID namespace of its own, or skip saying why not."""
    command = ["unshare", "--pid", "--fork", "--kill-child"]
    if shutil.which("unshare") is None:
        pytest.skip("no unshare command to start a rank in another PID namespace")
    probe = subprocess.run([*command, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a PID namespace ({' '.join(command)}): {probe.stderr.strip()}")
    return command


def test_one_node_job_with_a_rank_in_another_pid_namespace():
    """One host, 3 ranks, rank 2 in its own PID namespace, so the creator's /proc/PID/fd is not its own:
    it runs as a node of its own, and the one-node job becomes a two-node one (with Gloo groups)."""
    unshare = _pid_namespace_prefix()
    before = shm_entries()
    result = spawn("tests.multinode:matrix", 3, env={**SMALL_CHUNKS, "SHMCOLL_HOSTID": "one-host"}, args=["5003"],
                   rank_prefix=lambda rank: unshare if rank == 2 else [], timeout=90)
    assert_job_passes(result, min_cases=182)
    for report in result.reports:
        assert report["hierarchical"] and report["flat_gloo"] and report["nodes"] == [[0, 1], [2]], report
    assert "rank 2 cannot map the shm arena of its node (ranks 0, 1, 2)" in result.outputs[2], result.outputs[2]
    assert "PID namespaces" in result.outputs[2]
    assert shm_entries() - before == set()


def test_arena_that_cannot_be_created_fails_on_every_rank_of_every_node():
    """Rank 2 cannot create node [2, 3]'s arena: every rank raises naming it, none waits for Gloo."""
    result = spawn("tests.multinode:layout_only", 4, env={"TEST_FAIL_ATTACH": "2"},
                   rank_env=_hosts([0, 0, 1, 1]), timeout=60)
    for rank in range(4):
        output = result.outputs[rank]
        assert result.returncodes[rank] != 0 and result.reports[rank] is None, output
        assert "cannot set up the shm group: rank 2 (node of ranks 2, 3)" in output, output
        assert "TEST_FAIL_ATTACH" in output, output


# -- a rank of another node dies mid-collective ------------------------------------------

# The node reduce-scatter of the all_reduce's rails split over three lanes (shmcoll.lanes): 64 KiB segments give
# each local rank 10 KiB of the 5003 elements, two lanes of 4 KiB or more.
NODE_STAGES_ON_LANES = {**SMALL_CHUNKS, "SHMCOLL_SEGMENT_BYTES": "65536", "SHMCOLL_THREAD_BYTES": "4096",
                        "SHMCOLL_THREADS": "3"}


@pytest.mark.parametrize("layout, victim, op, env, first_errors", [
    # rank 2's arena wait sees 3 dead and closes its rail; rank 0 then loses rail 0, rank 1 rail 1.
    ("2+2", 3, "all_reduce", SMALL_CHUNKS,
     {0: "on rail 0 (ranks 0, 2) failed", 1: "on rail 1 (ranks 1, 3) failed", 2: "rank(s) 3 died"}),
    # The same with rank 0's node stage on lanes: one of its lanes waits for rank 1.
    ("2+2", 1, "all_reduce", NODE_STAGES_ON_LANES,
     {0: "rank(s) 1 died", 2: "on rail 0 (ranks 0, 2) failed", 3: "on rail 1 (ranks 1, 3) failed"}),
    # rank 0's exchange with the other leader fails; rank 1, waiting in the node barrier for rank 0 (alive), is told at once.
    ("2+2", 2, "barrier", SMALL_CHUNKS, {0: "on the leaders' link (ranks 0, 2) failed", 1: "rank(s) 0 gave up",
                                         3: "rank(s) 2 died"}),
    # rank 0 gives up in its node stage with the next segment's Gloo broadcast from rank 3 in flight: rank 3 is
    # told at once, not at Gloo's timeout (the failed plan's works no longer hold the connection open).
    ("3+1", 1, "broadcast", SMALL_CHUNKS, {0: "rank(s) 1 died", 2: "rank(s) 1 died",
                                           3: "Gloo broadcast on rail 0 (ranks 0, 3) failed"}),
], ids=["all_reduce-rank3-dies", "all_reduce-on-lanes-rank1-dies", "barrier-rank2-dies", "3+1-broadcast-rank1-dies"])
def test_peer_dying_mid_collective_makes_the_group_unusable(layout, victim, op, env, first_errors):
    before = shm_entries()
    rank_nodes = LAYOUTS[layout]
    result = spawn("tests.multinode_faults:peer_dies", len(rank_nodes), backend="gloo", env=env, args=[str(victim), op],
                   rank_env=_hosts(rank_nodes), timeout=4 * GROUP_TIMEOUT_S)
    assert result.returncodes[victim] == -signal.SIGKILL, result.outputs[victim]
    for rank, expected in first_errors.items():
        report, output = result.reports[rank], result.outputs[rank]
        assert result.returncodes[rank] == 0 and report is not None, output
        failed = {case: error for case, error in report["cases"].items() if error is not None}
        assert not failed and len(report["cases"]) == 5, failed
        assert report["layout"]["hierarchical"], report
        assert (report["layout"]["lane_threads"] > 0) == ("SHMCOLL_THREADS" in env), report["layout"]
        assert expected in report["first_error"], report["first_error"]
        # Well before the group's timeout: nobody waited for a rank that had given up.
        assert report["elapsed"] < GROUP_TIMEOUT_S / 3, report
    assert shm_entries() - before == set()


# Which rank sees the death itself differs from case to case: a node mate through its process (the arena's
# pids), a peer on another node through a connection that closed although the rank had not given up; every
# other survivor learns it from them. Victims alone on their node (3+1's rank 3) are seen by no node mate.
@pytest.mark.parametrize("layout, victim, op, when", [
    ("2+2", 3, "all_reduce", "before"),
    ("2+2", 2, "barrier", "before"),
    ("2+2", 1, "all_gather_into_tensor", "during"),
    ("2+2", 2, "reduce_scatter_tensor", "during"),
    ("2+2", 3, "all_to_all_single", "during"),
    ("3+1", 3, "all_reduce", "during"),
    ("3+1", 1, "broadcast", "before"),
], ids=lambda value: str(value))
def test_every_survivor_names_the_rank_that_died(layout, victim, op, when):
    """A rank killed before or during a collective across nodes: every survivor's error names it, with its
    node, and comes well within a second or two (no survivor waits out the group's timeout to learn it)."""
    rank_nodes = LAYOUTS[layout]
    before = shm_entries()
    result = spawn("tests.multinode_faults:peer_dies", len(rank_nodes), backend="gloo", env=SMALL_CHUNKS,
                   args=[str(victim), op, when], rank_env=_hosts(rank_nodes), timeout=4 * GROUP_TIMEOUT_S)
    assert result.returncodes[victim] == -signal.SIGKILL, result.outputs[victim]
    dead = f"rank {victim} (node {rank_nodes[victim]}) died"
    errors = {rank: report and report["first_error"] for rank, report in enumerate(result.reports) if rank != victim}
    for rank, error in errors.items():
        report, output = result.reports[rank], result.outputs[rank]
        assert result.returncodes[rank] == 0 and report is not None, output
        failed = {case: text for case, text in report["cases"].items() if text is not None}
        assert not failed and len(report["cases"]) == 5, failed
        assert not report["leaks"], report["leaks"]
        assert dead in error, f"rank {rank} does not name {dead!r}: {error}\nevery survivor's first error: {errors}"
        assert report["elapsed"] < 2.0, report
    assert shm_entries() - before == set()


@pytest.mark.parametrize("layout, victim, op, unknown", [
    # Rank 2 is alone on its node and the all_gather of unequal nodes runs on the flat group, whose failed Gloo
    # collective names no peer: no survivor can tell that rank 2 died rather than gave up.
    ("2+1", 2, "all_gather_into_tensor", "no rank posted one within 1 s"),
    # Rank 0 hosts the store (env:// rendezvous): its node mate sees it die, the other node cannot ask.
    ("2+2", 0, "all_reduce", "the group's store cannot be reached"),
], ids=["2+1-alone-on-its-node", "2+2-store-host-dies"])
def test_survivors_that_cannot_learn_the_cause_still_raise_promptly(layout, victim, op, unknown):
    """Where the cause cannot be learnt, the survivors that do not see it raise all the same, within about a
    second (``causes.LEARN_S``), saying why it is not known; those that see it name it."""
    rank_nodes = LAYOUTS[layout]
    result = spawn("tests.multinode_faults:peer_dies", len(rank_nodes), backend="gloo", env=SMALL_CHUNKS,
                   args=[str(victim), op, "before"], rank_env=_hosts(rank_nodes), timeout=4 * GROUP_TIMEOUT_S)
    assert result.returncodes[victim] == -signal.SIGKILL, result.outputs[victim]
    dead = f"rank {victim} (node {rank_nodes[victim]}) died"
    for rank in range(len(rank_nodes)):
        if rank == victim:
            continue
        report, output = result.reports[rank], result.outputs[rank]
        assert result.returncodes[rank] == 0 and report is not None, output
        error = report["first_error"]
        if rank_nodes[rank] == rank_nodes[victim]:
            assert dead in error, error
        else:
            assert f"cause: not known here: {unknown}" in error, error
        assert report["elapsed"] < 2.0, report


# -- subgroups ------------------------------------------------------------------------------

def test_subgroups_across_and_inside_nodes():
    before = shm_entries()
    result = spawn("tests.multinode:subgroups", 4, env=SMALL_CHUNKS, args=["5003"], rank_env=_hosts([0, 0, 1, 1]),
                   timeout=90)
    assert_job_passes(result, min_cases=[132, 192, 120, 132])  # members of 2, 3, 2, 2 subgroups
    expected = {  # group ranks per node; None: one node, shared memory only, no Gloo group
        "1+2": [[0], [1]], "0+1": None, "2+3": None, "0+1+3": [[0, 1], [2]]}
    for rank, report in enumerate(result.reports):
        mine = {"+".join(map(str, members)) for members in SUBGROUPS if rank in members}
        assert set(report["layouts"]) == mine, report["layouts"]
        for name in mine:
            layout, nodes = report["layouts"][name], expected[name]
            assert layout["nodes"] == nodes, (name, layout)
            assert layout["hierarchical"] == layout["flat_gloo"] == (nodes is not None), (name, layout)
    assert shm_entries() - before == set()
