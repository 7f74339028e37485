"""Where a group's ranks live, decided once when the group is made.

A *placement* runs every collective of the backend's surface for one group,
synchronously, on tensors the surface has already checked:

  SingleRank  one rank: local copies                      (placement.single)
  OneNode     every rank on this node: the shared arena   (placement.node)
  Nodes       several nodes: arenas inside, Gloo between  (placement.nodes, with placement.flat for
              the operations that have no hierarchical plan)

Each offers the same methods, with the same arguments::

  allreduce(tensor, red, desc)                reduce(tensor, root, red, desc)
  reduce_scatter(output, input, red, desc)    broadcast(tensor, root, desc)
  allgather(outputs, input, desc)             allgather_into(output, input, desc)
  gather(outputs | None, input, root, desc)   scatter(output, inputs | None, root, desc)
  alltoall(outputs, inputs, desc)             alltoall_single(output, input, out_blocks, in_blocks, desc)
  barrier(desc)                               send(tensor, dst, tag) -> Work;  recv(tensor, src | None, tag) -> Work
  set_background(on)      abort(why): waits in progress raise within a slice      close()      summary() -> lines
  abandon(): this rank takes no further step (a collective failed part-way): its local peers' waits raise
  one_shot_bytes: all-reduces up to this size may call one_shot(tensor, count, red, desc) (0: no such path)
  compiled_paths() -> node.CompiledPaths | None: what the group's compiled small collectives and transfers
      (shmcoll._front.SmallCollectives, shmcoll._p2p.SmallTransfers) run on, where they run (OneNode):
      the arena's steps and schedule; one_lane_bytes, per collective ("all_reduce", "broadcast",
      "all_gather", "reduce_scatter") the most bytes per rank (a reduce-scatter's per block) that it runs in
      one C schedule call on one lane of its arena (the all-reduce: one one-shot step); async_try_bytes, an
      asynchronous collective of at most this many bytes per rank that they take runs there as far as it goes
      without waiting, the rest queued; and the point-to-point engine
  async_inline: whether an asynchronous collective runs inline when nothing is queued: only where it waits
      for no peer (one rank)
  allgather_windows(input, unit, consume, desc): the all-gather of ``input`` handed to
      consume(start, n, addresses) window by window, each window a multiple of ``unit`` bytes of every
      rank's input (rank r's bytes [start, start + n) at addresses[r], readable until consume returns):
      in place in the arena's slots on one node, else one window gathered into private memory

``red`` is an ``ops.Reduction``; ``desc`` the collective's descriptor (``descriptors.descriptor``),
which shared-memory steps carry so that ranks in different collectives are caught.
Results are in place; a reduction's ``finish`` is the surface's.
"""
from __future__ import annotations

from datetime import timedelta

from shmcoll import lanes, single_copy, topology, waits
from shmcoll._logging import log
from shmcoll.agreement import agree_settings
from shmcoll.arena import MAX_LANES
from shmcoll.node_arena import open_node_arena


def lanes_wanted(settings) -> int:
    """Threads this rank would give a collective: ``SHMCOLL_THREADS``, else what the user chose for the rank's
    computation (torch's thread count, which OMP_NUM_THREADS and torchrun set), at most MAX_LANES."""
    import torch

    wanted = settings.threads if settings.threads is not None else torch.get_num_threads()
    return max(1, min(wanted, MAX_LANES))


def create(store, rank: int, size: int, timeout: timedelta, settings, describe):
    """The placement of this rank in a new group (collective: every rank of the group calls it).

    ``describe()`` names the collective in progress, for the arena's error messages.
    """
    from shmcoll.placement.node import OneNode
    from shmcoll.placement.nodes import Nodes
    from shmcoll.placement.single import SingleRank

    if size == 1:
        return SingleRank()
    # torch reuses a group's store prefix when a process initialises again, so every
    # key of ours lives under this incarnation's number: each rank adds 1 once.
    incarnation = (store.add("shmcoll/incarnation", 1) - 1) // size
    keys = f"shmcoll/{incarnation}"
    settings = agree_settings(store, keys, rank, size, settings)
    topo = topology.discover(store, rank, size, topology.host_identity(settings.hostid), keys)
    # Lanes serve the collectives of one node, and the node stages of the plans across nodes; the arena's layout
    # depends on how many the node's ranks agree on (lanes pair inside a node only: nodes may differ).
    def agree_lanes(local_ranks: list[int], key: str) -> int:
        return lanes.agree(store, key, rank, local_ranks, lanes_wanted(settings), settings.threads is not None)

    # A rank that cannot map its node's arena becomes a node of its own (even in a one-node job).
    def wait_policy(current: topology.Topology) -> waits.Policy:
        return waits.policy(settings, len(current.local_ranks), across_nodes=not current.single_node)

    topo, arena = open_node_arena(store, rank, size, topo, settings, timeout, wait_policy, keys, agree_lanes)
    if arena is not None:
        arena.describe = describe
    policy = wait_policy(topo)
    if topo.single_node:
        verdict = single_copy.agree(store, f"{keys}/single-copy", rank, topo.local_ranks, settings)
        if verdict.refused is not None and rank == topo.local_ranks[0] and settings.single_copy != "0":
            log.info("single-copy transfers are not allowed between the ranks of this node, so large collectives "
                     "copy through shared memory: %s", verdict.refused)
        return OneNode(arena, rank, settings, policy, lanes.Lanes(arena, settings.thread_bytes), verdict)
    return Nodes(store, rank, size, timeout, topo, arena, keys, policy, settings)
