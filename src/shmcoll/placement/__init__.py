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
  one_shot_bytes: all-reduces up to this size may call one_shot(tensor, count, red, desc) (0: no such path)
  inline_async_bytes: an asynchronous collective of at most this many bytes per rank runs inline when nothing
      is queued (too small for overlap to pay for the progress thread's hand-off)
  allgather_windows(input, unit, consume, desc): the all-gather of ``input`` handed to
      consume(start, n, addresses) window by window, each window a multiple of ``unit`` bytes of every
      rank's input (rank r's bytes [start, start + n) at addresses[r], readable until consume returns):
      in place in the arena's slots on one node, else one window gathered into private memory

``red`` is an ``ops.Reduction``; ``desc`` the collective's descriptor (``descriptors.descriptor``),
which shared-memory steps carry so that ranks in different collectives are caught.
Results are in place; a reduction's ``finish`` is the surface's.
"""
from __future__ import annotations

import os
from datetime import timedelta

from shmcoll import lanes, single_copy, topology
from shmcoll._logging import log
from shmcoll.agreement import agree_settings
from shmcoll.arena import MAX_LANES
from shmcoll.node_arena import open_node_arena
from shmcoll.waits import SLEEP_AT_ONCE, Budgets


def wait_policy(settings, local_size: int) -> Budgets:
    """The wait budgets of every wait on an arena of ``local_size`` ranks.

    A pure spin reacts fastest but holds the core; a sched_yield loop is almost
    as quick when the core is otherwise idle and hands the core over when a
    peer (or anything else) is runnable on it. So: a short spin, unless local
    ranks outnumber cores, then yields, then the futex sleep. Where they
    outnumber the cores, a rank yields only while another shares its core: the
    kernel leaves three ranks on one of two cores for tens of milliseconds when
    the fourth yields on the other, a few when it sleeps (4 ranks on 2 cores,
    256 KiB: 15-22% off all_reduce, reduce_scatter and broadcast over 8 jobs,
    BENCHMARKS "More ranks than cores").
    """
    oversubscribed = local_size > len(os.sched_getaffinity(0))
    spin_us = settings.spin_us if settings.spin_us is not None else (0.0 if oversubscribed else 20.0)
    yield_us = settings.yield_us if settings.yield_us is not None else (200.0 if oversubscribed else 500.0)
    return Budgets(int(spin_us * 1000), int(yield_us * 1000), oversubscribed)


def lanes_wanted(settings) -> int:
    """Threads this rank would give a collective: ``SHMCOLL_THREADS``, else what the user chose for the rank's
    computation (torch's thread count, which OMP_NUM_THREADS and torchrun set), at most MAX_LANES."""
    import torch

    wanted = settings.threads if settings.threads is not None else torch.get_num_threads()
    return max(1, min(wanted, MAX_LANES))


class WaitBudgets:
    """The wait budgets of one arena: inline, and for collectives on the progress thread.

    An async collective runs while the caller computes, typically on the same
    cores (DDP's backward): spinning or yielding there takes cycles from the
    computation it overlaps, so those waits sleep on the futex at once (measured
    on DDP with 2 ranks on 2 cores: communication overhead per step 50-53 -> 42-44
    ms). Explicit SHMCOLL_SPIN_US / SHMCOLL_YIELD_US apply to both.
    """

    def __init__(self, settings, local_size: int):
        self.inline = wait_policy(settings, local_size)
        explicit = settings.spin_us is not None or settings.yield_us is not None
        self.background = self.inline if explicit else SLEEP_AT_ONCE

    def apply(self, arena, background: bool) -> None:
        if arena is not None:
            arena.set_waits(self.background if background else self.inline)

    def describe(self) -> str:
        spin_ns, yield_ns, if_shared = self.inline
        shared = " while another local rank shares the core" if if_shared else ""
        return (f"  waits: spin {spin_ns / 1000:g} us, sched_yield {yield_ns / 1000:g} us{shared}, then futex sleep "
                f"({len(os.sched_getaffinity(0))} usable CPUs); on the progress thread: "
                f"{'the same' if self.background == self.inline else 'futex sleep at once'}")


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
    # Lanes serve collectives inside one node (the node stages of a plan across nodes run on one thread), and
    # the arena's layout depends on how many the node's ranks agree on.
    def agree_lanes(local_ranks: list[int], key: str) -> int:
        if not topo.single_node:  # the same on every rank: no agreement needed
            return 1
        return lanes.agree(store, key, rank, local_ranks, lanes_wanted(settings), settings.threads is not None)

    # A rank that cannot map its node's arena becomes a node of its own (even in a one-node job).
    topo, arena = open_node_arena(store, rank, size, topo, settings, timeout,
                                  lambda local_size: wait_policy(settings, local_size), keys, agree_lanes)
    if arena is not None:
        arena.describe = describe
    waits = WaitBudgets(settings, len(topo.local_ranks))
    if topo.single_node:
        verdict = single_copy.agree(store, f"{keys}/single-copy", rank, topo.local_ranks, settings)
        if verdict.refused is not None and rank == topo.local_ranks[0] and settings.single_copy != "0":
            log.info("single-copy transfers are not allowed between the ranks of this node, so large collectives "
                     "copy through shared memory: %s", verdict.refused)
        return OneNode(arena, rank, settings, waits, lanes.Lanes(arena, settings.thread_bytes), verdict)
    return Nodes(store, rank, size, timeout, topo, arena, keys, waits, settings)
