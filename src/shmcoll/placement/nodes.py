"""Collectives across nodes: a shm arena inside each node, Gloo "rails" between nodes.

Terms (see DESIGN.md, "Across nodes"):
  node     the ranks of the group that share a host identity; nodes are ordered by
           their lowest rank, the ranks of a node by rank. N nodes; L_n local ranks.
  rail     local rank i of every node that has one: a Gloo group over TCP. Every
           rank is on exactly one rail; all rails run at once.
  flat     one Gloo group over all ranks, for operations with no hierarchical plan
           here (and for every plan that needs equal nodes when they are not equal).

Each plan moves about 1/L of the data across nodes per rank. Every method runs
inside the backend's ProgressEngine (in issue order) and completes synchronously.
A plan that fails part-way gives up for good (see ``_gives_up_on_failure``).
Operations without a plan here, and plans that need nodes of equal size when
they are not, run on the flat group (``placement.flat``).
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from shmcoll import kernel_abi, ops
from shmcoll._torch_compat import AllgatherOptions
from shmcoll.algorithms import allgather as _allgather
from shmcoll.algorithms import barrier as _barrier
from shmcoll.algorithms import broadcast as _broadcast
from shmcoll.algorithms import allreduce as _allreduce
from shmcoll.algorithms import reduce_scatter as _reduce_scatter
from shmcoll.errors import InterNodeError, ShmcollError
from shmcoll.placement.flat import Flat, finish_average, gloo_op
from shmcoll.placement.node import OnArena
from shmcoll.placement.whole import allgather_whole
from shmcoll.staging import staged, staged_empty, unstage


def _bytes_view(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as a flat uint8 tensor (data movement is dtype-agnostic)."""
    return tensor.reshape(-1).view(torch.uint8)


def _gives_up_on_failure(plan):
    """A plan that fails part-way (a Gloo call between nodes, a dead or mismatched local peer)
    leaves its node's arena and its rail mid-collective: no later step on them can be trusted.

    So it tells the local ranks (the arena's abandoned word) and closes this rank's rail,
    whose peers on other nodes then fail at once ("connection closed") instead of at the
    timeout, and raises a ShmcollError, after which the backend refuses every collective.
    """

    @functools.wraps(plan)
    def run(self, *args):
        try:
            return plan(self, *args)
        except Exception as error:
            self._give_up()
            if isinstance(error, ShmcollError):
                raise
            raise InterNodeError(f"rank {self.rank}: {plan.__name__} across nodes failed part-way: "
                                 f"{type(error).__name__}: {error}") from error

    return run


def _node_stage(red: ops.Reduction) -> tuple[int, float]:
    """(kernel op, scale) of a reduction's stage inside a node: AVG is a SUM there, divided by the
    world size at the end (``finish_average``); PREMUL_SUM's factor is linear, so it applies there."""
    return (kernel_abi.SUM, 1.0) if red.op.average else (red.op.kernel, red.scale)


def _on_flat(name: str):
    """A method of Nodes that hands the call to the flat group."""

    def call(self, *args):
        return getattr(self.flat, name)(*args)

    call.__name__ = name
    call.__doc__ = f"No hierarchical plan: the flat Gloo group's {name}."
    return call


class Nodes(OnArena):
    """The group's placement across nodes: this rank's node arena, its rail and the flat group.

    One method per collective of the backend's surface: the hierarchical plans
    below, and the flat group's for every other (``_on_flat``).
    """

    one_shot_bytes = 0  # no small all-reduce path: every all-reduce crosses the rails

    def __init__(self, store, rank: int, size: int, timeout, topo, arena, keys: str, waits):
        """``arena``: this rank's node arena (open_node_arena), None when its node is itself alone."""
        self.rank, self.size = rank, size
        self.nodes = topo.nodes
        self.node = topo.node
        self.local_ranks = topo.local_ranks
        self.local_rank = self.local_ranks.index(rank)
        self.local_size = len(self.local_ranks)
        self.tcp_bytes = 0  # bytes handed to rail Gloo groups by this rank (for benchmarks)
        # Plans that need every node to hold the same number of ranks.
        self.uniform = len({len(ranks) for ranks in self.nodes}) == 1
        self.arena = arena
        self.waits = waits  # placement.WaitBudgets
        # rail_nodes[i]: the node indices on rail i, in node order (a node's rail rank is its position).
        self.rail_nodes = [[n for n, ranks in enumerate(self.nodes) if len(ranks) > i]
                           for i in range(max(len(ranks) for ranks in self.nodes))]
        members = self.rail_nodes[self.local_rank]
        self.rail_ranks = [self.nodes[n][self.local_rank] for n in members]  # for messages
        self.rail = None
        if len(members) > 1:
            self.rail = dist.ProcessGroupGloo(dist.PrefixStore(f"{keys}/rail/{self.local_rank}", store),
                                              members.index(self.node), len(members), timeout)
        self.flat = Flat(dist.ProcessGroupGloo(dist.PrefixStore(f"{keys}/flat", store), rank, size, timeout),
                         rank, size)
        # The rail every node is on (0 always is), and the local rank each root's data enters it from.
        self.full_rails = min(len(ranks) for ranks in self.nodes)

    # No hierarchical plan (yet): the flat group runs these.
    reduce = _on_flat("reduce")
    allgather = _on_flat("allgather")
    gather = _on_flat("gather")
    scatter = _on_flat("scatter")
    alltoall = _on_flat("alltoall")
    alltoall_single = _on_flat("alltoall_single")
    send = _on_flat("send")
    recv = _on_flat("recv")

    def set_background(self, on: bool) -> None:
        """Collectives that follow run on the progress thread (``on``) or inline."""
        self.waits.apply(self.arena, on)

    def summary(self) -> list[str]:
        lines = [f"  nodes: {self.nodes}; this node's arena: "
                 + (f"{self.arena.segment.size / 2**20:.1f} MiB" if self.arena is not None else "none (alone)"),
                 "  across nodes: intra-node reduce-scatter, Gloo rail all_reduce, intra-node all-gather; "
                 "ops without a hierarchical plan run on a flat Gloo group"]
        if self.arena is not None:
            lines.append(self.waits.describe())
        return lines

    def close(self) -> None:
        self._close_arena()
        # Stop the Gloo groups' worker threads now, while the interpreter is whole: left to be
        # destroyed at interpreter exit, a Gloo group can abort the process ("terminate called
        # without an active exception").
        if self.rail is not None:
            self.rail.shutdown()
            self.rail = None
        self.flat.close()

    def _give_up(self) -> None:
        if self.arena is not None:
            self.arena.abandon()
        self.rail = None  # the last reference: Gloo closes its connections now

    # -- pieces --------------------------------------------------------------

    def _over_rail(self, what: str, start) -> None:
        """Start one Gloo call on our rail and wait for it; a failure names the rail's ranks."""
        try:
            start(self.rail).wait()
        except Exception as error:
            raise InterNodeError(f"rank {self.rank}: Gloo {what} between nodes on rail {self.local_rank} (ranks "
                                 f"{', '.join(map(str, self.rail_ranks))}) failed: {type(error).__name__}: "
                                 f"{error}") from error

    def _rail_allreduce(self, tensor: torch.Tensor, redop) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = redop
        self.tcp_bytes += tensor.numel() * tensor.element_size()
        self._over_rail("all_reduce", lambda rail: rail.allreduce([tensor], opts))

    def _intra_broadcast(self, buf: torch.Tensor, local_root: int, desc: int) -> None:
        if self.arena is not None and buf.numel():
            _broadcast.broadcast(self.arena, buf.data_ptr(), buf.numel() * buf.element_size(), local_root, desc)

    def _node_reduce_scatter(self, blocks: torch.Tensor, block_count: int, red: ops.Reduction,
                             desc: int) -> torch.Tensor:
        """Block l of the L blocks of ``block_count`` elements in ``blocks``, reduced over this node,
        on local rank l (the node stage of a reduction; see ``_node_stage``)."""
        op_kernel, kscale = _node_stage(red)
        if self.arena is None:  # alone on the node: our one block is the node's
            if kscale != 1.0:
                blocks.mul_(kscale)
            return blocks
        out = torch.empty(block_count, dtype=blocks.dtype)
        _reduce_scatter.reduce_scatter(self.arena, blocks.data_ptr(), block_count, blocks.element_size(),
                                       red.kernel, op_kernel, kscale, out.data_ptr(), desc)
        return out

    # -- plans ---------------------------------------------------------------

    @_gives_up_on_failure
    def allreduce(self, tensor: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        """Intra-node reduce-scatter, rail all-reduce of our shard, intra-node all-gather.

        Nodes of different sizes: reduce to each node's first rank, all-reduce on rail 0, broadcast.
        """
        flat = red.view(tensor)
        if flat.numel() == 0:
            return
        if not self.uniform:
            return self._allreduce_by_leaders(flat, red, desc)
        count, itemsize, L = flat.numel(), flat.element_size(), self.local_size
        block = -(-count // L)  # elements of each local rank's shard
        if block * L == count and flat.is_contiguous():
            work = flat
        else:
            work = torch.zeros(block * L, dtype=flat.dtype)
            work[:count].copy_(flat.reshape(-1))
        shard = self._node_reduce_scatter(work, block, red, desc)
        self._rail_allreduce(shard, gloo_op(red))
        if red.op.average:
            finish_average(shard, self.size)
        if self.arena is not None:
            _allgather.allgather(self.arena, shard.data_ptr(), block * itemsize,
                                 (work.data_ptr(), block * itemsize), desc)
        if work is not flat:
            flat.copy_(work[:count].view_as(flat))

    def _allreduce_by_leaders(self, flat: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        op_kernel, kscale = _node_stage(red)
        work = staged(flat)
        if self.arena is not None:
            _allreduce.reduce_scatter_allgather(self.arena, work.data_ptr(), work.numel(), work.element_size(),
                                                red.kernel, op_kernel, kscale, desc, root=0)
        elif kscale != 1.0:
            work.mul_(kscale)
        if self.local_rank == 0:
            self._rail_allreduce(work, gloo_op(red))
            if red.op.average:
                finish_average(work, self.size)
        self._intra_broadcast(work, 0, desc)
        unstage(flat, work)

    @_gives_up_on_failure
    def broadcast(self, tensor: torch.Tensor, root: int, desc: int) -> None:
        """Root's rail carries the data to every node, then each node broadcasts it locally.

        When some node lacks the root's local rank, the root's node first broadcasts
        locally and rail 0 (on every node) carries it.
        """
        if tensor.numel() == 0:
            return
        work = staged(tensor)
        root_node = next(n for n, ranks in enumerate(self.nodes) if root in ranks)
        root_local = self.nodes[root_node].index(root)
        entry = root_local if root_local < self.full_rails else 0
        if self.node == root_node and entry != root_local:
            self._intra_broadcast(work, root_local, desc)
        if self.local_rank == entry and work.numel():
            opts = dist.BroadcastOptions()
            opts.rootRank = self.rail_nodes[entry].index(root_node)
            data = _bytes_view(work)
            self.tcp_bytes += data.numel() if self.node == root_node else 0
            self._over_rail("broadcast", lambda rail: rail.broadcast([data], opts))
        if self.node != root_node or entry == root_local:
            self._intra_broadcast(work, entry, desc)
        unstage(tensor, work)

    @_gives_up_on_failure
    def allgather_into(self, output: torch.Tensor, input: torch.Tensor, desc: int) -> None:
        """Gather the node's inputs locally, all-gather the node blocks over the rail, place in rank order."""
        if not self.uniform:  # the plan needs nodes of equal size
            return self.flat.allgather_into(output, input, desc)
        if input.numel() == 0:
            return
        N, L = len(self.nodes), self.local_size
        source = _bytes_view(input.contiguous())
        nbytes = source.numel()
        gathered = torch.empty(N * L * nbytes, dtype=torch.uint8)
        node_block = gathered[self.node * L * nbytes:(self.node + 1) * L * nbytes]
        if self.arena is None:
            node_block.copy_(source)
        else:
            _allgather.allgather(self.arena, source.data_ptr(), nbytes, (node_block.data_ptr(), nbytes), desc)
        self.tcp_bytes += L * nbytes
        self._over_rail("all_gather", lambda rail: rail._allgather_base(gathered, node_block.clone(),
                                                                        AllgatherOptions()))
        target = staged_empty(output)
        out = _bytes_view(target).view(self.size, nbytes)
        blocks = gathered.view(N, L, nbytes)
        for n, ranks in enumerate(self.nodes):
            out[torch.tensor(ranks)] = blocks[n]
        unstage(output, target)

    def allgather_windows(self, input: torch.Tensor, unit: int, consume, desc: int) -> None:
        allgather_whole(self, self.size, input, consume, desc)

    @_gives_up_on_failure
    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, red: ops.Reduction, desc: int) -> None:
        """Local rank l reduces, within the node, the blocks of the ranks on rail l; the rail reduce-scatters them."""
        if not self.uniform:  # the plan needs nodes of equal size
            return self.flat.reduce_scatter(output, input, red, desc)
        output, input = red.view(output), red.view(input)
        N, L = len(self.nodes), self.local_size
        M = output.numel()
        if M == 0:
            return
        blocks = input.reshape(self.size, M)
        # Block l of the node stage: the N blocks of rail l's ranks, in node order.
        order = [self.nodes[n][l] for l in range(L) for n in range(N)]
        by_rail = blocks[torch.tensor(order)].reshape(-1)
        partial = self._node_reduce_scatter(by_rail, N * M, red, desc)
        result = torch.empty(M, dtype=output.dtype)
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = gloo_op(red)
        self.tcp_bytes += partial.numel() * partial.element_size()
        self._over_rail("reduce_scatter", lambda rail: rail._reduce_scatter_base(result, partial, opts))
        if red.op.average:
            finish_average(result, self.size)
        output.copy_(result.view_as(output))

    @_gives_up_on_failure
    def barrier(self, desc: int) -> None:
        """Node barrier, rail 0 barrier among the nodes' first ranks, node barrier."""
        if self.arena is not None:
            _barrier.barrier(self.arena, desc)
        if self.local_rank == 0:
            self._over_rail("barrier", lambda rail: rail.barrier())
        if self.arena is not None:
            _barrier.barrier(self.arena, desc)
