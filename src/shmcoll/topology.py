"""Which ranks of a group share a node, learned through the group's store."""
from __future__ import annotations

import socket
from typing import NamedTuple


class Topology(NamedTuple):
    nodes: list[list[int]]  # group ranks per node, nodes ordered by their lowest rank
    node: int  # index of this rank's node in ``nodes``

    @property
    def local_ranks(self) -> list[int]:
        return self.nodes[self.node]

    @property
    def single_node(self) -> bool:
        return len(self.nodes) == 1


def host_identity(override: str | None) -> str:
    """``SHMCOLL_HOSTID`` if set, else hostname plus kernel boot id (like NCCL_HOSTID)."""
    if override:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}:{boot}"


def arranged(nodes, rank: int) -> Topology:
    """The Topology of ``rank`` among ``nodes`` (lists of group ranks), in canonical order."""
    ordered = sorted((sorted(ranks) for ranks in nodes), key=lambda ranks: ranks[0])
    return Topology(ordered, next(i for i, ranks in enumerate(ordered) if rank in ranks))


def split_off(topo: Topology, rank: int, alone) -> Topology:
    """``topo`` with every rank of ``alone`` made a node of its own (as seen by ``rank``)."""
    nodes = [[r] for r in alone]
    nodes += [rest for rest in ([r for r in ranks if r not in alone] for ranks in topo.nodes) if rest]
    return arranged(nodes, rank)


def discover(store, rank: int, size: int, hostid: str, prefix: str = "shmcoll") -> Topology:
    """Publish our host identity and group ranks by identical identities."""
    store.set(f"{prefix}/host/{rank}", hostid)
    keys = [f"{prefix}/host/{r}" for r in range(size)]
    ids = [value.decode() for value in store.multi_get(keys)]
    nodes: dict[str, list[int]] = {}
    for r, ident in enumerate(ids):
        nodes.setdefault(ident, []).append(r)
    return arranged(nodes.values(), rank)
