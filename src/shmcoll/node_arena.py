"""Which ranks share a node arena: each maps its node's, and all agree on the outcome through the store.

A rank that cannot map the arena its node's lowest rank created (AttachError:
another PID namespace, /proc/PID/fd out of reach, mmap refused) runs as a node of
its own: its collectives with the rest of its host go over Gloo, as between any
two nodes, slower but correct. Every rank reads every rank's outcome, so all
derive the same topology; the ranks left on a node that lost one map a fresh,
smaller arena in the next round. A round that goes wrong removes at least one
rank, so there are at most as many rounds as ranks, and one when all goes well.

Creating the arena is another matter: when the lowest rank cannot create it (a
full /dev/shm, an unusable SHMCOLL_SHM_DIR), no rank of that node could share
memory, and moving them all to TCP would hide a configuration problem (and a
large slowdown) behind a warning. That is an error on every rank of the group,
as is any other failure here (a peer that died, a store timeout): without this
agreement the ranks of other nodes would wait for the Gloo rendezvous instead.
"""
from __future__ import annotations

from datetime import timedelta

from shmcoll import topology
from shmcoll._logging import log
from shmcoll.arena import open_arena
from shmcoll.errors import AttachError, PeerAttachError, ShmcollError

# A rank's outcome of one round, as published in the store.
_MAPPED = "mapped"  # mapped its node's arena, or its node is itself alone
_CANNOT_MAP = "cannot-map:"  # + why: this rank could not map an arena that exists
_PEER_CANNOT_MAP = "peer-cannot-map:"  # + why: a local peer could not map the arena this rank created
_FAILED = "failed:"  # + why: anything else; the group cannot be set up

# How long a rank that failed waits for the others' outcomes (to name every failure) before raising its own.
_REPORT_WAIT = timedelta(seconds=10)


def open_node_arena(store, rank: int, size: int, topo: topology.Topology, settings, timeout: timedelta,
                    wait_policy, keys: str, agree_lanes=lambda local_ranks, key: 1):
    """(the Topology every rank agreed on, this rank's node arena or None when its node is itself alone).

    ``wait_policy(topology)`` gives the wait policy (``waits.Policy``) of a rank placed so;
    ``agree_lanes(local_ranks, key)`` the lane count those ranks agree on (every one of them calls it), which
    shapes their arena.
    """
    alone: dict[int, str] = {}  # rank -> why it cannot map its node's arena
    for round_ in range(size):
        current = topology.split_off(topo, rank, alone) if alone else topo
        local = current.local_ranks
        arena, outcome, own_error = None, _MAPPED, None
        if len(local) > 1:
            try:
                key = f"{keys}/arena/{round_}/{local[0]}"
                arena = open_arena(store, local.index(rank), len(local), local, settings, timeout,
                                   wait_policy(current).inline, key=key, lanes=agree_lanes(local, key))
            except AttachError as error:
                outcome = _CANNOT_MAP + str(error)
            except PeerAttachError as error:
                outcome = _PEER_CANNOT_MAP + str(error)
            except Exception as error:  # reported to every rank, then raised here too
                outcome, own_error = _FAILED + f"{type(error).__name__}: {error}", error
        prefix = f"{keys}/attached/{round_}"
        try:
            outcomes = _exchange(store, prefix, rank, size, outcome, timeout if own_error is None
                                 else min(timeout, _REPORT_WAIT))
        except Exception as error:  # a rank that never reports (it died, or is stuck before this point)
            if arena is not None:
                arena.close()
            if own_error is not None:
                raise own_error
            raise ShmcollError(f"rank {rank}: not every rank reported whether it could map its node's shm arena "
                               f"within {timeout.total_seconds():g} s: {error}") from error
        cannot_map = {r: o[len(_CANNOT_MAP):] for r, o in enumerate(outcomes) if o.startswith(_CANNOT_MAP)}
        failed = {r: o[len(_FAILED):] for r, o in enumerate(outcomes) if o.startswith(_FAILED)}
        if not failed and any(o.startswith(_PEER_CANNOT_MAP) for o in outcomes) and not cannot_map:
            failed = {r: o for r, o in enumerate(outcomes) if o.startswith(_PEER_CANNOT_MAP)}
        if failed:
            if arena is not None:
                arena.close()
            _let_everyone_read(store, prefix, size)
            raise ShmcollError(f"rank {rank} cannot set up the shm group: "
                               f"{_describe_failures(failed, current)}") from own_error
        if not cannot_map:
            return current, arena
        if arena is not None:
            arena.close()  # its node loses a rank: the rest map a smaller one next round
        for r, why in cannot_map.items():
            if rank in (r, 0):
                node = next(ranks for ranks in current.nodes if r in ranks)
                log.warning("rank %d cannot map the shm arena of its node (ranks %s), so it runs as a node of its "
                            "own and reaches them over Gloo: %s", r, ", ".join(map(str, node)), why)
        alone.update(cannot_map)
    raise ShmcollError(f"rank {rank}: no agreement on the node arenas after {size} rounds")  # cannot happen


def _exchange(store, prefix: str, rank: int, size: int, outcome: str, timeout: timedelta) -> list[str]:
    """Publish our outcome; return every rank's, in rank order."""
    store.set(f"{prefix}/{rank}", outcome)
    keys = [f"{prefix}/{r}" for r in range(size)]
    store.wait(keys, timeout)
    return [value.decode() for value in store.multi_get(keys)]


def _let_everyone_read(store, prefix: str, size: int) -> None:
    """Before raising: wait (briefly) until every rank has read the outcomes, since the store
    may live in one of the ranks (env://) and go away when it raises."""
    try:
        if store.add(f"{prefix}/read", 1) == size:
            store.set(f"{prefix}/all-read", "1")
        store.wait([f"{prefix}/all-read"], _REPORT_WAIT)
    except Exception:
        pass


def _describe_failures(failed: dict[int, str], topo: topology.Topology) -> str:
    """The failures, leaving out those of ranks whose node's creator failed (they only echo it)."""
    causes = []
    for r, why in sorted(failed.items()):
        node = next(ranks for ranks in topo.nodes if r in ranks)
        if r == node[0] or node[0] not in failed:
            causes.append(f"rank {r} (node of ranks {', '.join(map(str, node))}): {why}")
    return "; ".join(causes)
