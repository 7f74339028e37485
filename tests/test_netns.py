"""Two nodes that really talk over TCP: torchrun in each of two network namespaces joined by a veth pair.

Each namespace runs `torchrun --nnodes 2 --nproc-per-node 2` with its own SHMCOLL_HOSTID
and GLOO_SOCKET_IFNAME (its veth end, so Gloo binds 10.77.0.1 / 10.77.0.2, not lo).
Between the namespaces there is no other path, and the veth byte counters must have
grown by at least the bytes the rails handed to Gloo: the inter-node traffic went over
TCP between the two addresses. Skips (saying why, with the failing command's stderr)
where namespaces cannot be made: not root, no `ip`, no CAP_NET_ADMIN.
"""
import pytest

from tests.harness import assert_job_passes, shm_entries, torchrun_nodes
from tests.multinode import SMALL_CHUNKS
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
    assert_job_passes(result, min_cases=162)
    for report in result.reports:
        assert report["hierarchical"] and report["flat_gloo"] and report["nodes"] == [[0, 1], [2, 3]], report
    after = [pair.counters(node) for node in range(2)]
    sent = [after[node]["tx_bytes"] - before[node]["tx_bytes"] for node in range(2)]
    received = [after[node]["rx_bytes"] - before[node]["rx_bytes"] for node in range(2)]
    # What each node's ranks handed to their rails; Gloo sends at least half of it to the other
    # node (a 2-rank reduce-scatter keeps half its input), plus the flat fallbacks and headers.
    rail_bytes = [sum(result.reports[rank]["tcp_bytes"] for rank in ranks) for ranks in ([0, 1], [2, 3])]
    print(f"veth tx {sent}, rx {received}; bytes handed to rails {rail_bytes}")
    for node in range(2):
        assert rail_bytes[node] > 1_000_000, rail_bytes
        assert sent[node] >= rail_bytes[node] // 2, (node, sent, rail_bytes)
        assert received[1 - node] >= rail_bytes[node] // 2, (node, received, rail_bytes)
    assert shm_entries() - before_shm == set()
