"""torch's semantics of Works and asynchronous calls, tried as a hostile caller would, on shm and on Gloo in the
same job (tests/test_async.py).

- An ``async_op=True`` call never waits for a peer it was not asked to wait for: rank 0 issues it on group A
  and then a blocking call on group B, every other rank the other way round; an asynchronous collective and
  then a blocking receive whose sender joins the collective only after its send. Gloo finishes each in well
  under a second; so must shm (a group's timeout of a few seconds turns a hang into a failed case).
- A Work per call: two calls through the group's method never share one, and each one's ``result()`` is its
  own call's tensors.
- Nothing held: a tensor given to a finished collective (synchronous, asynchronous run inline or queued, on
  every compiled path and the general one, point-to-point) is freed once the caller drops it and its Work.

Inputs differ per rank and position (``tests.references.make_input``) and every result is checked against a
local reference.
"""
from __future__ import annotations

import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from tests.references import assert_equal, make_input

# What "finishes at once" means here: Gloo takes well under 0.1 s for these on 2 cores; a hang would take the
# group's timeout (GROUP_TIMEOUT), which is what shm did before asynchronous calls stopped waiting for peers.
# Half of it: 4 ranks of 1 MiB on 2 cores under other jobs' load took Gloo 1.19 s (the whole suite on torch 2.15).
PROMPT_S = 2.0
RELEASED_S = 1.0  # how soon a call's tensors are freed once it and its Work are dropped
GROUP_TIMEOUT = timedelta(seconds=4)
DTYPE = torch.float32
ITEM = 4


class Collective:
    """One collective of ``nbytes`` per rank on a group: its inputs from (case, rank), the call, the check."""

    def __init__(self, name: str, case: str, nbytes: int, rank: int, world: int):
        self.name, self.case, self.rank, self.world = name, case, rank, world
        self.count = nbytes // ITEM
        self.root = world - 1
        inputs = [make_input(case, r, DTYPE, self.count) for r in range(world)]
        self.inputs = inputs
        mine = inputs[rank].clone()
        n, w = self.count, world
        if name == "all_reduce":
            self.tensor, self.expected = mine, torch.stack(inputs).sum(0)
        elif name == "reduce":
            self.tensor = mine
            self.expected = torch.stack(inputs).sum(0) if rank == self.root else None
        elif name == "broadcast":
            self.tensor, self.expected = mine, inputs[self.root]
        elif name == "all_gather":
            self.tensor, self.outputs, self.expected = mine, [torch.empty(n) for _ in range(w)], inputs
        elif name == "all_gather_into_tensor":
            self.tensor, self.output, self.expected = mine, torch.empty(n * w), torch.cat(inputs)
        elif name in ("reduce_scatter", "reduce_scatter_tensor"):
            blocks = [make_input(f"{case}/rs", r, DTYPE, n * w) for r in range(w)]
            self.tensor, self.output = blocks[rank], torch.empty(n)
            self.expected = torch.stack(blocks).sum(0)[rank * n:(rank + 1) * n]
        elif name == "gather":
            self.tensor = mine
            self.outputs = [torch.empty(n) for _ in range(w)] if rank == self.root else None
            self.expected = inputs if rank == self.root else None
        elif name == "scatter":
            self.output = torch.empty(n)
            self.expected = inputs[rank]
            self.scattered = [t.clone() for t in inputs] if rank == self.root else None
        elif name in ("all_to_all_single", "all_to_all"):
            blocks = [make_input(f"{case}/a2a", r, DTYPE, n * w) for r in range(w)]
            self.tensor, self.output = blocks[rank], torch.empty(n * w)
            self.expected = torch.cat([b[rank * n:(rank + 1) * n] for b in blocks])
        elif name == "barrier":
            self.expected = None
        else:
            raise ValueError(name)

    def issue(self, group, async_op: bool):
        name = self.name
        if name == "all_reduce":
            return dist.all_reduce(self.tensor, group=group, async_op=async_op)
        if name == "reduce":
            return dist.reduce(self.tensor, self.root, group=group, async_op=async_op)
        if name == "broadcast":
            return dist.broadcast(self.tensor, self.root, group=group, async_op=async_op)
        if name == "all_gather":
            return dist.all_gather(self.outputs, self.tensor, group=group, async_op=async_op)
        if name == "all_gather_into_tensor":
            return dist.all_gather_into_tensor(self.output, self.tensor, group=group, async_op=async_op)
        if name == "reduce_scatter":
            return dist.reduce_scatter(self.output, list(self.tensor.chunk(self.world)), group=group,
                                       async_op=async_op)
        if name == "reduce_scatter_tensor":
            return dist.reduce_scatter_tensor(self.output, self.tensor, group=group, async_op=async_op)
        if name == "gather":
            return dist.gather(self.tensor, self.outputs, self.root, group=group, async_op=async_op)
        if name == "scatter":
            return dist.scatter(self.output, self.scattered, self.root, group=group, async_op=async_op)
        if name == "all_to_all_single":
            return dist.all_to_all_single(self.output, self.tensor, group=group, async_op=async_op)
        if name == "all_to_all":  # the list form, over views of the same tensors
            return dist.all_to_all(list(self.output.chunk(self.world)), list(self.tensor.chunk(self.world)),
                                   group=group, async_op=async_op)
        return dist.barrier(group=group, async_op=async_op)

    def check(self) -> None:
        name, what = self.name, f"{self.case}: {self.name}"
        if self.expected is None:
            return
        if name in ("all_gather", "gather"):
            for got, want in zip(self.outputs, self.expected):
                assert_equal(got, want, what)
        elif name in ("all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "scatter",
                      "all_to_all_single", "all_to_all"):
            assert_equal(self.output, self.expected, what)
        else:
            assert_equal(self.tensor, self.expected, what)


COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "gather", "scatter", "all_to_all_single", "all_to_all", "barrier")
GLOO_LACKS = ("all_to_all",)  # ProcessGroupGloo has no list form of all_to_all: shm alone


def _groups(backend: str):
    return (dist.new_group(backend=backend, timeout=GROUP_TIMEOUT),
            dist.new_group(backend=backend, timeout=GROUP_TIMEOUT))


def async_semantics(cases, inline_limit: str, p2p_bytes: str):
    """Every case on shm and on Gloo groups over the same ranks (tests/test_async.py): ``inline_limit`` the most
    bytes per rank an asynchronous call is tried inline with, ``p2p_bytes`` the group's SHMCOLL_P2P_BYTES."""
    rank, world = dist.get_rank(), dist.get_world_size()
    limit, p2p_half = int(inline_limit), int(p2p_bytes) // 2
    pairs = {backend: _groups(backend) for backend in ("shm", "gloo")}
    # 8 B to just above the size the compiled small collectives try inline, per rank.
    sizes = (8, 4096, limit - (16 << 10), limit + 4 * ITEM)

    def crossed(backend: str, name: str, nbytes: int):
        first, second = pairs[backend] if rank == 0 else reversed(pairs[backend])
        case = f"crossed/{backend}/{name}/{nbytes}"
        mine, theirs = Collective(name, f"{case}/first", nbytes, rank, world), \
            Collective(name, f"{case}/second", nbytes, rank, world)
        # Rank 0 starts with group A, the others with group B: each rank's blocking call is one its peers
        # issued asynchronously, so it ends only if their asynchronous calls did not wait for it.
        if rank != 0:
            mine, theirs = theirs, mine
        start = time.monotonic()
        work = mine.issue(first, async_op=True)
        theirs.issue(second, async_op=False)
        work.wait()
        elapsed = time.monotonic() - start
        mine.check()
        theirs.check()
        assert elapsed < PROMPT_S, f"{case}: took {elapsed:.2f} s"

    for name in COLLECTIVES:
        for nbytes in sizes if name != "barrier" else (0,):
            for backend in ("gloo", "shm") if name not in GLOO_LACKS else ("shm",):
                cases.run(f"crossed/{backend}/{name}/{nbytes}", crossed, backend, name, nbytes)
    # Empty tensors (a collective that still meets), and every call on the general path: under the profiler
    # the compiled small collectives take none.
    profiled = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "barrier")
    for name in profiled[:-1]:
        cases.run(f"crossed/shm/{name}/0", crossed, "shm", name, 0)
    with torch.profiler.profile():
        dist.barrier(group=pairs["gloo"][0])  # every rank's profiler started (its first start takes a second)
        for name in profiled:
            for nbytes in (8, 240 << 10) if name != "barrier" else (0,):
                cases.run(f"crossed/shm/{name}/{nbytes}/profiled", crossed, "shm", name, nbytes)

    # An asynchronous collective, then a blocking receive whose sender joins the collective after its send
    # (which, from two chunks of the channel on, waits for its receiver). Around the channel's chunk sizes.
    def async_then_recv(backend: str, nbytes: int):
        group = pairs[backend][0]
        case = f"async_then_recv/{backend}/{nbytes}"
        reduced = Collective("all_reduce", case, 16, rank, world)
        message = make_input(f"{case}/message", 1, DTYPE, max(1, nbytes // ITEM))
        start = time.monotonic()
        if rank == 0:
            work = reduced.issue(group, async_op=True)
            got = torch.empty_like(message)
            dist.recv(got, 1, group=group)
            work.wait()
            assert_equal(got, message, case)
        elif rank == 1:
            dist.send(message, 0, group=group)
            reduced.issue(group, async_op=False)
        else:
            reduced.issue(group, async_op=False)
        reduced.check()
        assert time.monotonic() - start < PROMPT_S, f"{case}: took {time.monotonic() - start:.2f} s"

    for nbytes in (16, p2p_half - 256, p2p_half + 256, 2 * p2p_half + 256, 160_000, 4 << 20):
        for backend in ("gloo", "shm"):
            cases.run(f"async_then_recv/{backend}/{nbytes}", async_then_recv, backend, nbytes)

    group = pairs["shm"][0]

    def late_peers(name: str, nbytes: int):
        """Every rank but the last comes first, so that their asynchronous call cannot finish inline and its rest
        runs on the progress thread; the caller drops its input tensor at once and reuses the memory (the Work,
        or the queued rest, must keep what the schedule still reads), and then polls: the progress thread,
        not a wait, finishes the call."""
        case = f"late_peers/{name}/{nbytes}"
        n = max(1, nbytes // ITEM)
        blocks = [make_input(case, r, DTYPE, n * world) for r in range(world)]
        if rank == world - 1:
            time.sleep(0.05)
        if name == "all_gather_into_tensor":
            output = torch.empty(n * world)
            work = dist.all_gather_into_tensor(output, blocks[rank][:n].clone(), group=group, async_op=True)
            expected = torch.cat([b[:n] for b in blocks])
        elif name == "all_gather":  # the list form: the rest also needs where each output is
            outputs = [torch.empty(n) for _ in range(world)]
            work = dist.all_gather(outputs, blocks[rank][:n].clone(), group=group, async_op=True)
            expected = torch.cat([b[:n] for b in blocks])
        elif name == "reduce_scatter_tensor":
            output = torch.empty(n)
            work = dist.reduce_scatter_tensor(output, blocks[rank].clone(), group=group, async_op=True)
            expected = torch.stack(blocks).sum(0)[rank * n:(rank + 1) * n]
        elif name == "broadcast":
            output = blocks[rank][:n].clone()
            work = dist.broadcast(output, 0, group=group, async_op=True)
            expected = blocks[0][:n]
        elif name == "all_to_all_single":
            output = torch.empty(n * world)
            work = dist.all_to_all_single(output, blocks[rank].clone(), group=group, async_op=True)
            expected = torch.cat([b[rank * n:(rank + 1) * n] for b in blocks])
        elif name == "all_to_all":  # the list form: the rest also needs where each block comes from and goes
            outputs = [torch.empty(n) for _ in range(world)]
            work = dist.all_to_all(outputs, [block.clone() for block in blocks[rank].chunk(world)], group=group,
                                   async_op=True)
            expected = torch.cat([b[rank * n:(rank + 1) * n] for b in blocks])
        else:
            output = blocks[rank][:n].clone()
            work = dist.all_reduce(output, group=group, async_op=True)
            expected = torch.stack([b[:n] for b in blocks]).sum(0)
        garbage = [torch.full((n * world,), 1e30) for _ in range(4)]  # the freed memory, written over
        deadline = time.monotonic() + PROMPT_S
        while not work.is_completed():
            assert time.monotonic() < deadline, f"{case}: never completed"
            time.sleep(0.001)
        work.wait()
        del garbage
        assert_equal(torch.cat(outputs) if name in ("all_gather", "all_to_all") else output, expected, case)

    for name in ("all_reduce", "broadcast", "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor",
                 "all_to_all_single", "all_to_all"):
        for nbytes in (8, 4096, 240 << 10):
            for n in range(2):  # the second: the compiled path's call, once the first admitted its plan
                cases.run(f"late_peers/{name}/{nbytes}#{n}", late_peers, name, nbytes)

    def works_per_call(name: str, nbytes: int, async_op: bool):
        """Two calls through the group's method: two Works, each with its own call's result, whichever path
        (compiled, general, inline or queued) ran them."""
        case = f"works_per_call/{name}/{nbytes}/async={async_op}"
        n = max(1, nbytes // ITEM)
        first, second = make_input(f"{case}/1", rank, DTYPE, n), make_input(f"{case}/2", rank, DTYPE, n)
        # all_reduce twice: world x the sum (exact: the inputs are quarters of small integers)
        expected = [world * sum(make_input(f"{case}/{k}", r, DTYPE, n) for r in range(world)) for k in (1, 2)]
        works = []
        for tensor in (first, second):
            for _ in range(2):  # the second of each: the plan admitted by the first, the fast paths' call
                if name == "allreduce":
                    opts = dist.AllreduceOptions()
                    opts.asyncOp = async_op
                    works.append((group.allreduce([tensor], opts), tensor))
                else:
                    opts = dist.BroadcastOptions()
                    opts.rootRank = 0
                    opts.asyncOp = async_op
                    works.append((group.broadcast([tensor], opts), tensor))
                works[-1][0].wait()
        objects = [work for work, _ in works]
        assert len({id(w) for w in objects}) == len(objects), f"{case}: calls shared a Work: {objects}"
        for work, tensor in works:
            assert work.result()[0] is tensor, f"{case}: a Work's result is another call's tensor"
        if name == "allreduce":
            assert_equal(first, expected[0], case)
            assert_equal(second, expected[1], case)

    for name in ("allreduce", "broadcast"):
        for nbytes in (8, limit + 4 * ITEM):
            for async_op in (False, True):
                cases.run(f"works_per_call/{name}/{nbytes}/async={async_op}", works_per_call, name, nbytes, async_op)

    def released(case: str, call, poll: bool):
        """``call(given)`` makes the tensors of a collective, appends each to ``given``, and returns its Work (or
        None); once it is done and dropped, with its tensors, nothing holds any of them (``poll``: wait by
        polling, so that the progress thread, not this one, runs a queued call)."""
        given = []
        work = call(given, (128 << 10 if "/big/" in case else 2) * world)
        watchers = [weakref.ref(t) for t in given]
        if work is not None:
            if poll:
                deadline = time.monotonic() + PROMPT_S
                while not work.is_completed():
                    assert time.monotonic() < deadline, f"{case}: never completed"
                    time.sleep(0.001)
            work.wait()
        del work, given
        # Freed by their last reference going, as torch frees them, with no cycle collection: the progress thread
        # drops a call it ran just after it marks it done, which the wait may see first.
        deadline = time.monotonic() + RELEASED_S
        while any(watcher() is not None for watcher in watchers) and time.monotonic() < deadline:
            time.sleep(0.001)
        alive = [n for n, watcher in enumerate(watchers) if watcher() is not None]
        assert not alive, f"{case}: tensors {alive} of the call are alive after it and its Work were dropped"

    def tensors(given, *counts):
        made = [make_input(f"released/{n}", rank, DTYPE, count) for n, count in enumerate(counts)]
        given.extend(made)
        return made

    def method_call(given, n):
        (tensor,) = tensors(given, n)
        opts = dist.AllreduceOptions()
        opts.asyncOp = False
        work = group.allreduce([tensor], opts)
        assert work.result()[0] is tensor, "the held Work's result is not its call's"
        return work

    def send_or_recv(given, n):
        (tensor,) = tensors(given, n)
        if rank % 2 == 0:
            dist.send(tensor, rank + 1, group=group)
        else:
            dist.recv(tensor, rank - 1, group=group)

    calls = {
        "method": method_call,
        "send_recv": send_or_recv,
        "barrier": lambda given, n: dist.barrier(group=group, async_op=True),
    }
    for async_op in (False, True):
        calls.update({
            f"all_reduce/async={async_op}": lambda given, n, a=async_op: dist.all_reduce(
                *tensors(given, n), group=group, async_op=a),
            f"broadcast/async={async_op}": lambda given, n, a=async_op: dist.broadcast(
                *tensors(given, n), 0, group=group, async_op=a),
            f"all_gather_into_tensor/async={async_op}": lambda given, n, a=async_op: dist.all_gather_into_tensor(
                *tensors(given, n * world, n), group=group, async_op=a),
            f"all_gather/async={async_op}": lambda given, n, a=async_op: dist.all_gather(
                tensors(given, *[n] * world), *tensors(given, n), group=group, async_op=a),
            f"reduce_scatter_tensor/async={async_op}": lambda given, n, a=async_op: dist.reduce_scatter_tensor(
                *tensors(given, n, n * world), group=group, async_op=a),
            f"reduce/async={async_op}": lambda given, n, a=async_op: dist.reduce(
                *tensors(given, n), 0, group=group, async_op=a),
            f"all_to_all_single/async={async_op}": lambda given, n, a=async_op: dist.all_to_all_single(
                *tensors(given, n, n), group=group, async_op=a),
            f"all_to_all/async={async_op}": lambda given, n, a=async_op: dist.all_to_all(
                tensors(given, *[n // world] * world), tensors(given, *[n // world] * world), group=group,
                async_op=a),
        })
    for name, call in calls.items():
        if name == "send_recv" and world % 2:
            continue  # pairs of ranks
        for size in ("small", "big"):
            for poll in (False, True):
                case = f"released/{name}/{size}/poll={poll}"
                for n in range(2):  # the second: the compiled path's call, once the first admitted its plan
                    cases.run(f"{case}#{n}", released, case, call, poll)
    dist.barrier()


def works_held_by_torch(cases):
    """Works that torch holds from C++ or chains on, while later calls run inline around them: a functional
    collective's Work left in torch's registry until its ``wait_tensor``, futures chained with ``then``, DDP's
    comm hook futures. Each call's Work and future keep its own result, on shm as on Gloo (a Work shared between
    calls, or one that holds nothing where its caller looks, gives another call's tensors or none)."""
    import torch.distributed._functional_collectives as funcol
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"shm": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    total = world * (world + 1) / 2

    def functional(backend: str, n: int):
        group = groups[backend]
        case = f"functional/{backend}/{n}"
        pending = [funcol.all_reduce(torch.full((n,), float(rank + 1 + k)), "sum", group) for k in range(3)]
        # Inline calls, synchronous and asynchronous, while torch's registry holds the functional ones' Works.
        for k in range(4):
            later = torch.full((n,), float(rank + 1))
            work = dist.all_reduce(later, group=group, async_op=bool(k % 2))
            if work is not None:
                work.wait()
                assert work.result()[0] is later, f"{case}: an async Work's result is another call's"
            assert_equal(later, torch.full((n,), total), case)
        for k, tensor in enumerate(pending):
            assert_equal(torch.ops._c10d_functional.wait_tensor(tensor), torch.full((n,), total + world * k), case)

    def chained(backend: str, n: int):
        group = groups[backend]
        case = f"chained/{backend}/{n}"
        tensors = [torch.full((n,), float(rank + 1 + k)) for k in range(3)]
        futures = [dist.all_reduce(t, group=group, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
                   for t in tensors]
        for _ in range(3):
            dist.all_reduce(torch.ones(n), group=group)
        for k, future in enumerate(futures):
            assert_equal(future.wait(), torch.full((n,), 2 * (total + world * k)), case)

    def ddp_hook(backend: str):
        group = groups[backend]
        case = f"ddp_hook/{backend}"
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)), process_group=group,
                    bucket_cap_mb=0.0001)  # a bucket per parameter: several hooks in flight per step

        def hook(state, bucket):
            # between the asynchronous all-reduce and its completion, a synchronous call on the same group
            future = dist.all_reduce(bucket.buffer().div_(world), group=group, async_op=True).get_future()
            dist.all_reduce(torch.zeros(1), group=group)
            return future.then(lambda f: f.value()[0])

        model.register_comm_hook(None, hook)
        data = torch.arange(2 * 8 * (rank + 1), dtype=torch.float32).view(-1, 8)[-2:] / 10
        model(data).square().sum().backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        everyone = [torch.empty_like(grads) for _ in range(world)]
        dist.all_gather(everyone, grads, group=groups["gloo"])
        for other in everyone:  # every rank holds the same averaged gradients
            assert_equal(other, grads, case)
        return grads

    def waiting_callbacks(backend: str, n: int, how: str):
        """A future's callback that issues a collective on the same group and waits for it, as torch's PowerSGD
        DDP hook does, on ranks whose first call was left to the progress thread (the last rank comes late): a
        callback runs on whatever thread completes its future, which must not be the one its wait needs. ``how``
        it waits: for the future, for the Work, or for a future whose own callback waits again."""
        group = groups[backend]
        case = f"waiting_callbacks/{backend}/{n}/{how}"
        first, second, third = (torch.full((n,), float(rank + 1 + k)) for k in range(3))

        def callback(future):
            future.wait()
            work = dist.all_reduce(second, group=group, async_op=True)
            if how == "work":
                work.wait()
            elif how == "future":
                work.get_future().wait()
            else:
                work.get_future().then(
                    lambda _: dist.all_reduce(third, group=group, async_op=True).get_future().wait()).wait()
            return first

        if rank == world - 1:
            time.sleep(0.05)
        future = dist.all_reduce(first, group=group, async_op=True).get_future().then(callback)
        deadline = time.monotonic() + PROMPT_S
        while not future.done():
            assert time.monotonic() < deadline, f"{case}: never completed"
            time.sleep(0.001)
        future.wait()
        assert_equal(first, torch.full((n,), total), case)
        assert_equal(second, torch.full((n,), total + world), case)
        if how == "nested":
            assert_equal(third, torch.full((n,), total + 2 * world), case)

    def waiting_transfer_callbacks(n: int, how: str):
        """The same for a receive's future (shm alone: Gloo's point-to-point Works have none), whose callback
        receives again, the sender late: the point-to-point thread completes it, holding its engine's lock."""
        case = f"waiting_transfer_callbacks/{n}/{how}"
        messages = [make_input(f"{case}/{k}", 1, DTYPE, n) for k in range(2)]
        if rank == 1:
            time.sleep(0.05)
            for message in messages:
                dist.send(message, 0)
        elif rank == 0:
            received = [torch.empty(n) for _ in messages]

            def callback(future):
                future.wait()
                work = dist.irecv(received[1], 1)
                work.wait() if how == "work" else work.get_future().wait()
                return received

            future = dist.irecv(received[0], 1).get_future().then(callback)
            deadline = time.monotonic() + PROMPT_S
            while not future.done():
                assert time.monotonic() < deadline, f"{case}: never completed"
                time.sleep(0.001)
            future.wait()
            for got, want in zip(received, messages):
                assert_equal(got, want, case)

    for n in (2, 4099):
        for backend in ("gloo", "shm"):
            cases.run(f"functional/{backend}/{n}", functional, backend, n)
            cases.run(f"chained/{backend}/{n}", chained, backend, n)
    for n in (2, 1 << 20):  # 4 MiB: above what a call is tried inline with
        for how in ("future", "work", "nested"):
            # Gloo's two worker threads complete its futures: a callback that waits in a callback that waits
            # takes both, and the third collective waits for one forever
            for backend in ("gloo", "shm") if how != "nested" else ("shm",):
                cases.run(f"waiting_callbacks/{backend}/{n}/{how}", waiting_callbacks, backend, n, how)
        for how in ("future", "work"):
            cases.run(f"waiting_transfer_callbacks/{n}/{how}", waiting_transfer_callbacks, n, how)
    grads = {}

    def ddp_both():
        grads.update({backend: ddp_hook(backend) for backend in ("gloo", "shm")})
        # Gloo sums 3 ranks in another order than shm's rank order: the last bits may differ, never more
        torch.testing.assert_close(grads["shm"], grads["gloo"], rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"ddp_hook: shm against gloo: {m}")

    cases.run("ddp_hook", ddp_both)
