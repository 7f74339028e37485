"""Two nodes that really talk over TCP: torchrun in each of two network namespaces joined by a veth pair.

Each namespace runs `torchrun --nnodes 2 --nproc-per-node 2` with its own SHMCOLL_HOSTID
and GLOO_SOCKET_IFNAME (its veth end, so Gloo binds 10.77.0.1 / 10.77.0.2, not lo).
Between the namespaces there is no other path: the collective matrix must be right
over TCP between the two addresses, and each plan must put on the link what the best
plan must move, as the veth byte counters show (a plan that sends a block L times fails). Skips (saying why, with the failing command's stderr)
where namespaces cannot be made: not root, no `ip`, no CAP_NET_ADMIN.
"""
import pytest

from tests.harness import assert_job_passes, shm_entries, torchrun_nodes
from tests.multinode import LINK_BYTES_PER_CALL, SMALL_CHUNKS
from tests.netns import NetnsUnavailable, leftover_namespaces, make_pair, remove_pair


@pytest.fixture
def netns_pair():
    try:
        pair = make_pair()
    except NetnsUnavailable as reason:
        print(f"network namespaces unavailable: {reason}")
        pytest.skip(f"network namespaces unavailable: {reason}")
    try:
        yield pair
    finally:
        remove_pair(pair)
    assert leftover_namespaces(pair) == [], "network namespaces left behind"


def test_two_nodes_over_tcp_between_network_namespaces(netns_pair):
    pair = netns_pair
    before_shm = shm_entries()
    before = [pair.counters(node) for node in range(2)]
    result = torchrun_nodes(
        "tests.multinode:matrix", ["5003"], nnodes=2, nproc=2, master_addr=pair.addresses[0],
        node_env=lambda node: {**SMALL_CHUNKS, "SHMCOLL_HOSTID": f"netns-node{node}",
                               "GLOO_SOCKET_IFNAME": pair.interfaces[node]},
        node_prefix=pair.exec_prefix, timeout=120)
    assert_job_passes(result, min_cases=206)
    for report in result.reports:
        assert report["hierarchical"] and report["flat_gloo"] and report["nodes"] == [[0, 1], [2, 3]], report
    after = [pair.counters(node) for node in range(2)]
    sent = [after[node]["tx_bytes"] - before[node]["tx_bytes"] for node in range(2)]
    received = [after[node]["rx_bytes"] - before[node]["rx_bytes"] for node in range(2)]
    print(f"veth tx {sent}, rx {received}")
    for node in range(2):  # the traffic between the nodes went over the veth pair, and only there
        assert sent[node] > 500_000 and received[1 - node] >= sent[node] * 0.99, (sent, received)
    assert shm_entries() - before_shm == set()


def test_each_plan_sends_what_it_must(netns_pair):
    """Each collective's bytes on the link, from the veth counters, against what the best plan must send
    (tests/multinode.py, LINK_BYTES_PER_CALL): a plan that sends a block twice, or L times, fails."""
    pair = netns_pair
    result = torchrun_nodes(
        "tests.multinode:link_bytes", [], nnodes=2, nproc=2, master_addr=pair.addresses[0],
        node_env=lambda node: {"SHMCOLL_HOSTID": f"netns-node{node}", "GLOO_SOCKET_IFNAME": pair.interfaces[node]},
        node_prefix=pair.exec_prefix, timeout=180)
    assert_job_passes(result, min_cases=len(LINK_BYTES_PER_CALL))
    size = result.reports[0]["size"]
    for node, leader in enumerate((0, 2)):  # local rank 0 of each node reads its veth end
        sent = result.reports[leader]["sent_per_call"]
        print(f"node {node} sends per call (S = {size} B): " + ", ".join(f"{op} {n / size:.3f} S" for op, n in sent.items()))
        for op, shares in LINK_BYTES_PER_CALL.items():
            must, back = shares[node] * size, shares[1 - node] * size
            # TCP/IP headers add ~5% to what a node sends, and its acknowledgements ~3% of what it receives.
            assert 0.95 * must <= sent[op] <= 1.1 * must + 0.06 * back + 32 * 1024, (node, op, sent[op] / size, shares)
