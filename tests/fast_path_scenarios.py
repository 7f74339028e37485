"""The fast paths: a call of an (op, dtype, root) met before takes its collective's fast path (no ``_launch``)
when it is synchronous, or asynchronous and small, with plain tensors; anything else takes the general path;
both give the reference's result. On one node, the calls that one C schedule call on one lane runs go whole
through compiled code (shmcoll._front.SmallCollectives), which reads each call's options from torch's
structs and keeps the group's bookkeeping as the general path does."""
from __future__ import annotations

import time
import weakref

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from shmcoll.placement.node import OneNode
from tests.references import assert_equal, make_input, ops_for, reference_reduce


class Subclass(torch.Tensor):
    pass


# (collective, dtype, op name) of the calls each variant is made of
CALLS = (("all_reduce", torch.float32, "sum"), ("all_reduce", torch.int32, "max"),
         ("reduce_scatter_tensor", torch.bfloat16, "sum"), ("broadcast", torch.float64, None),
         ("all_gather_into_tensor", torch.int16, None), ("all_gather", torch.float16, None),
         ("all_to_all_single", torch.int32, None), ("all_to_all", torch.float64, None), ("gather", torch.float32, None),
         ("scatter", torch.int64, None), ("reduce", torch.float32, "max"))
# (reduce last: its other ranks leave before its root, so a call right after one may find the root behind and go
# the general way, see ``run`` below)
# The ranks of a gather (all but its root) and of a scatter (its root, and the others once the root is seen) leave
# without waiting for every peer: a call of one starts after a barrier, so each rank's path is known.
LEAVE_APART = ("gather", "scatter")
# Above the one-shot limit and the size an asynchronous call is tried inline with, per rank, for every dtype of
# CALLS (2 bytes or more): overlap pays.
OVERLAP_PAYS = OneNode.async_try_bytes // 2 + 1
# (count, asynchronous, tensor type, whether the fast path takes it once admitted), in order: the first admits
VARIANTS = ((7, False, torch.Tensor, False), (7, False, torch.Tensor, True), (1, True, torch.Tensor, True),
            (5003, False, torch.Tensor, True), (OVERLAP_PAYS, True, torch.Tensor, False),
            (7, False, Subclass, False))
# Every op of these dtypes, sync and async, through each reducing collective's compiled path.
EVERY_OP_DTYPES = (torch.float32, torch.int32)
REDUCING = ("all_reduce", "reduce_scatter_tensor", "reduce")
LATE_PEER_CALLS = tuple(call for call in CALLS if call != ("all_reduce", torch.int32, "max"))
BARRIERS = ((False, False), (True, False), (False, True))  # (asynchronous, a late peer)
# The cases besides those tables: every root of a broadcast, every (op, root) of a reduce, async Works of their
# own, a list-form all_gather and an all_to_all_single whose asynchronous calls a late peer leaves to the progress
# thread, all_to_all_single's split sizes (uneven, and disagreeing between ranks), list-form calls whose caller
# empties its lists as soon as they return, and asynchronous calls of the most bytes the compiled path tries inline.
OTHER_CASES = (_EVERY_ROOT, _EVERY_REDUCE, _WORKS_OWN, _LATE_LISTED, _LATE_ALLTOALL, _SPLITS, _ROOTED, _LATE_ROOTED,
               _BACK_TO_BACK, _KEPT_LISTS, _ASYNC_MOST) = (
    "fast_path/every_root", "fast_path/reduce/every_op_and_root", "fast_path/async_works_own",
    "fast_path/all_gather/late_peer_async", "fast_path/all_to_all_single/late_peer_async",
    "fast_path/all_to_all_single/splits", "fast_path/gather_scatter/every_root",
    "fast_path/gather_scatter/late_peer", "fast_path/gather/back_to_back", "fast_path/list_forms/emptied_lists",
    "fast_path/async_at_the_limit")
BACK_TO_BACK_CALLS = 400


def fast_paths(cases):
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD  # the shm group is its own shm object (ProcessGroupShm)
    launches = []
    general = pg._launch
    pg._launch = lambda *args, **kwargs: launches.append(1) or general(*args, **kwargs)

    def own_work(case, work):
        # an asynchronous call's Work is its own (torch's synchronous wrappers share one completed Work)
        assert work is not pg._engine.shared_completed, f"{case}: an async call returned the shared completed Work"
        work.wait()

    def all_reduce(case, dtype, count, op_name, async_op, make=torch.Tensor):
        inputs = [make_input(case, r, dtype, count, op_name) for r in range(world)]
        tensor = inputs[rank].clone().as_subclass(make)
        work = dist.all_reduce(tensor, op=ops_for(dtype)[op_name], async_op=async_op)
        if async_op:
            own_work(case, work)
        assert_equal(tensor.as_subclass(torch.Tensor), reference_reduce(inputs, op_name, dtype), case)

    def reduce_scatter(case, dtype, count, op_name, async_op, make=torch.Tensor):
        inputs = [make_input(case, r, dtype, world * count, op_name) for r in range(world)]
        out = torch.zeros(count, dtype=dtype).as_subclass(make)
        work = dist.reduce_scatter_tensor(out, inputs[rank].clone(), op=ops_for(dtype)[op_name], async_op=async_op)
        if async_op:
            own_work(case, work)
        expected = reference_reduce(inputs, op_name, dtype)[rank * count:(rank + 1) * count]
        assert_equal(out.as_subclass(torch.Tensor), expected, case)

    def reduce(case, dtype, count, op_name, async_op, make=torch.Tensor, root=world - 1):
        inputs = [make_input(case, r, dtype, count, op_name) for r in range(world)]
        tensor = inputs[rank].clone().as_subclass(make)
        work = dist.reduce(tensor, root, op=ops_for(dtype)[op_name], async_op=async_op)
        if async_op:
            own_work(case, work)
        want = reference_reduce(inputs, op_name, dtype) if rank == root else inputs[rank]
        assert_equal(tensor.as_subclass(torch.Tensor), want, f"{case} (root {root})")

    def broadcast(case, dtype, count, op_name, async_op, make=torch.Tensor):
        root = world - 1
        tensor = (make_input(case, root, dtype, count) if rank == root else torch.zeros(count, dtype=dtype))
        tensor = tensor.as_subclass(make)
        work = dist.broadcast(tensor, root, async_op=async_op)
        if async_op:
            own_work(case, work)
        assert_equal(tensor.as_subclass(torch.Tensor), make_input(case, root, dtype, count), case)

    def all_gather(case, dtype, count, op_name, async_op, make=torch.Tensor):
        out = torch.zeros(world * count, dtype=dtype).as_subclass(make)
        work = dist.all_gather_into_tensor(out, make_input(case, rank, dtype, count), async_op=async_op)
        if async_op:
            own_work(case, work)
        everyone = torch.cat([make_input(case, r, dtype, count) for r in range(world)])
        assert_equal(out.as_subclass(torch.Tensor), everyone, case)

    def all_gather_listed(case, dtype, count, op_name, async_op, make=torch.Tensor):
        # the list form, its outputs apart (each its own tensor), in place for this rank's
        outs = [torch.zeros(count, dtype=dtype).as_subclass(make) for _ in range(world)]
        outs[rank].copy_(make_input(case, rank, dtype, count))
        work = dist.all_gather(outs, outs[rank], async_op=async_op)
        if async_op:
            own_work(case, work)
        for r in range(world):
            assert_equal(outs[r].as_subclass(torch.Tensor), make_input(case, r, dtype, count), f"{case} block {r}")

    def all_to_all_single(case, dtype, count, op_name, async_op, make=torch.Tensor):
        # even blocks (no split sizes): rank r's block j is make_input(case/j, r)
        out = torch.zeros(world * count, dtype=dtype).as_subclass(make)
        source = torch.cat([make_input(f"{case}/{j}", rank, dtype, count) for j in range(world)])
        work = dist.all_to_all_single(out, source, async_op=async_op)
        if async_op:
            own_work(case, work)
        expected = torch.cat([make_input(f"{case}/{rank}", r, dtype, count) for r in range(world)])
        assert_equal(out.as_subclass(torch.Tensor), expected, case)

    def all_to_all_listed(case, dtype, count, op_name, async_op, make=torch.Tensor):
        # the list form, blocks of uneven sizes (count, or one more where source + destination is odd): rank r's
        # block j is make_input(case/j, r)
        def length(src, dst):
            return count + (src + dst) % 2

        outs = [torch.zeros(length(r, rank), dtype=dtype).as_subclass(make) for r in range(world)]
        sources = [make_input(f"{case}/{j}", rank, dtype, length(rank, j)).as_subclass(make) for j in range(world)]
        work = dist.all_to_all(outs, sources, async_op=async_op)
        if async_op:
            own_work(case, work)
        for r in range(world):
            assert_equal(outs[r].as_subclass(torch.Tensor), make_input(f"{case}/{rank}", r, dtype, length(r, rank)),
                         f"{case} block {r}")

    def gather(case, dtype, count, op_name, async_op, make=torch.Tensor, root=0):
        # rank 0 gathers: the late peer (the last rank) is then one it waits for
        outs = [torch.zeros(count, dtype=dtype).as_subclass(make) for _ in range(world)] if rank == root else None
        work = dist.gather(make_input(case, rank, dtype, count).as_subclass(make), outs, dst=root, async_op=async_op)
        if async_op:
            own_work(case, work)
        for r in range(world if rank == root else 0):
            assert_equal(outs[r].as_subclass(torch.Tensor), make_input(case, r, dtype, count), f"{case} block {r}")

    def scatter(case, dtype, count, op_name, async_op, make=torch.Tensor, root=world - 1):
        # the root's block j is make_input(case/j, root)
        ins = ([make_input(f"{case}/{j}", root, dtype, count).as_subclass(make) for j in range(world)]
               if rank == root else None)
        out = torch.zeros(count, dtype=dtype).as_subclass(make)
        work = dist.scatter(out, ins, src=root, async_op=async_op)
        if async_op:
            own_work(case, work)
        assert_equal(out.as_subclass(torch.Tensor), make_input(f"{case}/{rank}", root, dtype, count), case)

    calls = {"all_reduce": all_reduce, "reduce_scatter_tensor": reduce_scatter, "broadcast": broadcast,
             "all_gather_into_tensor": all_gather, "all_gather": all_gather_listed, "reduce": reduce,
             "all_to_all_single": all_to_all_single, "all_to_all": all_to_all_listed, "gather": gather,
             "scatter": scatter}

    # On one node, the calls of the fast paths that one C schedule call on one lane runs go whole through
    # compiled code (shmcoll._front.SmallCollectives), which keeps the group's bookkeeping
    # (describe_current) as the general path does.
    compiled = getattr(pg._small, "taken", None)

    def compiled_calls() -> int:
        """How many calls the compiled path has run (0 where there is none: one rank, several nodes)."""
        return pg._small.taken if compiled is not None else 0
    compiled_bytes = getattr(pg.placement, "compiled_bytes", {})
    placement_kind = {"all_reduce": "all_reduce", "reduce_scatter_tensor": "reduce_scatter",
                      "broadcast": "broadcast", "all_gather_into_tensor": "all_gather", "all_gather": "all_gather",
                      "reduce": "reduce", "all_to_all_single": "all_to_all", "all_to_all": "all_to_all",
                      "gather": "gather", "scatter": "scatter"}

    for name, dtype, op_name in CALLS:
        call = calls[name]
        for n, (count, async_op, make, fast) in enumerate(VARIANTS):
            case = f"fast_path/{name}/{dtype}/{op_name}/n={count}/async={async_op}/{make.__name__}#{n}"

            if count == OVERLAP_PAYS:  # one rank runs everything inline (placement.single): it has nothing to overlap
                fast = pg.placement.async_inline
            if name in ("all_gather", "reduce", "all_to_all_single", "all_to_all", *LEAVE_APART) and compiled is None:
                fast = False  # no Python fast path

            def run():
                if name in LEAVE_APART:
                    dist.barrier()
                launches.clear()
                before = compiled_calls()
                seq = pg._state.seq
                call(case, dtype, count, op_name, async_op, make)
                took = compiled_calls() - before
                # A reduce's other ranks leave once their shares are published, while the root gathers them: the
                # next call of one takes the fast path only if the root has published by then (else the general
                # path waits for it). So only the root (the last rank here) is held to the path; all to the result.
                either = name == "reduce" and rank != world - 1
                went = "the general path" if launches else "the fast path"
                assert either or bool(launches) != fast, f"{case}: took {went}"
                want = fast and count * dtype.itemsize <= compiled_bytes.get(placement_kind[name], 0)
                assert either or took == want, f"{case}: the compiled path took {took} calls, not {int(want)}"
                # an all_to_all's descriptor names no count (each rank knows only its own sizes)
                named = f"all_to_all({str(dtype)[6:]}) #" if name.startswith("all_to_all") else f"{count} elements) #"
                assert pg._state.seq == seq + 1 and f"{named}{seq + 1}" in pg.describe_current(), \
                    f"{case}: the group's bookkeeping says {pg.describe_current()!r} after call #{seq + 1}"

            cases.run(case, run)

    # The compiled path reads each call's op, root and asyncOp from torch's options structs
    # (shmcoll.option_fields): every op of an all_reduce and a reduce_scatter_tensor, every root of a broadcast,
    # sync and async, gives the reference's result there (the second call of each: the first admits its plan).
    # An asynchronous call gets a Work of its own, which a later call's result does not change.
    reduced = []  # calls of every_op the compiled path took

    def every_op(case, call, dtype, op_name, async_op):
        for n in range(2):
            before = compiled_calls()
            call(f"{case}#{n}", dtype, 3, op_name, async_op)
        reduced.append(compiled_calls() - before)

    for dtype in EVERY_OP_DTYPES:
        for op_name in ops_for(dtype):
            for async_op in (False, True):
                for name in REDUCING:
                    cases.run(f"fast_path/every_op/{name}/{dtype}/{op_name}/async={async_op}", every_op,
                              f"every_op/{name}/{dtype}/{op_name}/async={async_op}", calls[name], dtype, op_name,
                              async_op)
    if compiled_bytes:  # at least sum, product, min and max of both dtypes, both ways, for both collectives
        cases.check("fast_path/every_op/compiled", sum(reduced) >= 4 * 2 * 2 * 2,
                    f"the compiled path took {sum(reduced)} of the {len(reduced)} calls")

    def every_root():
        for root in range(world):
            for async_op in (False, True):
                case = f"fast_path/every_root/{root}/async={async_op}"
                for n in range(2):
                    before = compiled_calls()
                    tensor = (make_input(case, root, torch.int64, 5) if rank == root
                              else torch.zeros(5, dtype=torch.int64))
                    work = dist.broadcast(tensor, root, async_op=async_op)
                    if async_op:
                        work.wait()
                        later = torch.zeros(3)
                        dist.all_reduce(later)  # runs inline too, after the broadcast's Work was made
                        assert work.result()[0] is tensor, f"{case}: the async Work's result is another call's"
                    assert_equal(tensor, make_input(case, root, torch.int64, 5), case)
                took = compiled_calls() - before
                assert took == (1 + async_op if compiled_bytes else 0), f"{case}: the compiled path took {took} calls"

    cases.run(_EVERY_ROOT, every_root)

    def every_reduce():
        # A reduce's plan is keyed by its op and its root together (Collectives._admit): each pair takes the
        # compiled path once it has met its own, with the descriptor of its own root.
        for root in range(world):
            for op_name in ("sum", "max"):
                case = f"{_EVERY_REDUCE}/{op_name}/root={root}"
                for n in range(2):
                    before = compiled_calls()
                    reduce(f"{case}#{n}", torch.int64, 5, op_name, False, root=root)
                    assert f"root {root}, 5 elements) #" in pg.describe_current(), \
                        f"{case}#{n}: the group's bookkeeping says {pg.describe_current()!r}"
                took = compiled_calls() - before
                if rank == root:  # the others' next call may find the root still gathering (see run above)
                    assert took == (1 if compiled_bytes else 0), f"{case}: the compiled path took {took} calls"

    cases.run(_EVERY_REDUCE, every_reduce)

    def async_works_own():
        # Every asynchronous call gets a Work of its own, whichever path ran it; one the caller dropped is not
        # handed out again (nothing can observe it, but nothing of it is kept either: tests/async_scenarios.py).
        x, y = torch.ones(3), torch.ones(4)
        works = [dist.all_reduce(x, async_op=True), dist.all_reduce(y, async_op=True)]
        first = weakref.ref(works[0])
        works[0].wait()
        del works[0]
        works.append(dist.all_reduce(x, async_op=True))
        assert first() is None or all(w is not first() for w in works), "a dropped async Work was handed out again"
        assert works[0] is not works[1] and works[0].result()[0] is y and works[1].result()[0] is x, \
            "an async Work is another call's"
        for work in works:
            work.wait()
        assert_equal(x, torch.full((3,), float(world ** 2)), _WORKS_OWN)

    cases.run(_WORKS_OWN, async_works_own)

    def async_at_the_limit():
        # An asynchronous call that puts in up to async_try_bytes (all_reduce's tensor, all_gather's input,
        # reduce_scatter's whole input) is the compiled path's, as far as it goes without waiting for a peer: handing
        # it whole to the progress thread would cost more than it does. (One rank runs it inline on the Python path.)
        limit = OneNode.async_try_bytes
        for name, count in (("all_reduce", limit // 4), ("all_gather_into_tensor", limit // 4),
                            ("reduce_scatter_tensor", limit // 4 // world)):
            case = f"{_ASYNC_MOST}/{name}"
            calls[name](f"{case}/admits", torch.float32, count, "sum", True)
            launches.clear()
            before = compiled_calls()
            calls[name](case, torch.float32, count, "sum", True)
            took = compiled_calls() - before
            want = compiled is not None and count * 4 <= compiled_bytes.get(placement_kind[name], 0)
            general = not want and not pg.placement.async_inline  # one rank: inline on the Python path
            assert took == want and bool(launches) == general, \
                f"{case}: the compiled path took {took} calls, not {int(want)}; the general path {len(launches)}"

    cases.run(_ASYNC_MOST, async_at_the_limit)

    def late_peer():
        # The last rank comes after several wait slices: the compiled path's first wait gives up and the
        # slow wait (finish_one_shot, finish_run of shmcoll.algorithms) finishes the call, with the same result.
        if rank == world - 1:
            time.sleep(0.35)
        before = compiled_calls()
        call(case, dtype, 7, op_name, False)
        if compiled_bytes:
            assert pg._small.taken == before + 1, f"{case}: the compiled path did not take the late call"
        if name in LEAVE_APART:  # the next case's calls find every rank here
            dist.barrier()

    for name, dtype, op_name in LATE_PEER_CALLS:
        call = calls[name]
        case = f"fast_path/{name}/late_peer"
        cases.run(case, late_peer)

    def late_peer_listed_async():
        # The compiled path's list form left to the progress thread: the rest reads the outputs' addresses
        # after the call has returned, and a later call of the same form must not change where they go. (The
        # barrier first: the late reduce before leaves its root behind the others, whose call would then find
        # the root's last step not yet reached and go the general way.)
        dist.barrier()
        if rank == world - 1:
            time.sleep(0.35)
        before = compiled_calls()
        outs = [torch.zeros(9, dtype=torch.float16) for _ in range(world)]
        work = dist.all_gather(outs, make_input(_LATE_LISTED, rank, torch.float16, 9), async_op=True)
        later = [torch.zeros(9, dtype=torch.float16) for _ in range(world)]
        dist.all_gather(later, make_input(f"{_LATE_LISTED}/later", rank, torch.float16, 9))
        work.wait()
        for r in range(world):
            assert_equal(outs[r], make_input(_LATE_LISTED, r, torch.float16, 9), f"{_LATE_LISTED} block {r}")
            assert_equal(later[r], make_input(f"{_LATE_LISTED}/later", r, torch.float16, 9), f"later block {r}")
        if compiled_bytes and world > 1:
            assert pg._small.taken >= before + 1, f"{_LATE_LISTED}: the compiled path did not take the call"

    cases.run(_LATE_LISTED, late_peer_listed_async)

    def late_peer_alltoall_async():
        # As the list form above: the rest of an asynchronous all_to_all_single left to the progress thread keeps
        # its own copy of the blocks' addresses, which the next call's overwrite (here the list form's, uneven, of
        # the plan both forms share), and of what the first step agreed.
        dist.barrier()
        if rank == world - 1:
            time.sleep(0.35)
        before = compiled_calls()
        late = f"{_LATE_ALLTOALL}/first"
        out = torch.zeros(world * 9, dtype=torch.int32)
        work = dist.all_to_all_single(out, torch.cat([make_input(f"{late}/{j}", rank, torch.int32, 9)
                                                      for j in range(world)]), async_op=True)
        all_to_all_listed(f"{_LATE_ALLTOALL}/later", torch.int32, 9, None, False)
        work.wait()
        assert_equal(out, torch.cat([make_input(f"{late}/{rank}", r, torch.int32, 9) for r in range(world)]), late)
        if compiled_bytes and world > 1:
            assert pg._small.taken >= before + 1, f"{_LATE_ALLTOALL}: the compiled path did not take the call"

    cases.run(_LATE_ALLTOALL, late_peer_alltoall_async)

    def rooted_every_root():
        # A gather's and a scatter's plan is keyed by its root (Collectives._admit): each root takes the compiled
        # path once it has met its own, sync and async, with the descriptor of its own root.
        for root in range(world):
            for async_op in (False, True):
                for name in LEAVE_APART:
                    case = f"{_ROOTED}/{name}/root={root}/async={async_op}"
                    for n in range(2):
                        dist.barrier()
                        before = compiled_calls()
                        calls[name](f"{case}#{n}", torch.int16, 5, None, async_op, root=root)
                        assert f"root {root}, 5 elements) #" in pg.describe_current(), \
                            f"{case}#{n}: the group's bookkeeping says {pg.describe_current()!r}"
                    took = compiled_calls() - before
                    assert took == (1 if compiled_bytes else 0), f"{case}: the compiled path took {took} calls"

    cases.run(_ROOTED, rooted_every_root)

    def late_peer_rooted():
        # The root's rest of a gather left to the progress thread (the last rank late) keeps its own copy of the
        # outputs' addresses, which the next call's try rewrites; a scatter of several slots whose root must wait
        # for the late rank before it reuses a buffer, likewise. Each after a call of its own (dtype, root) with no
        # rank late: that one admits the plan where no case before did (Collectives._admit). What the compiled
        # path took is read right after the calls: the barrier after them is one it may take too.
        slot_elements = pg.placement.arena.chunk_bytes // 4 if compiled_bytes else 1
        for name, count, async_op in (("gather", 9, True), ("scatter", 3 * slot_elements + 5, False)):
            case = f"{_LATE_ROOTED}/{name}"
            dist.barrier()
            calls[name](f"{case}/admitted", torch.float32, count, None, False, root=0)
            dist.barrier()
            if rank == world - 1:
                time.sleep(0.35)
            before = compiled_calls()
            if name == "gather":
                outs = [torch.zeros(9) for _ in range(world)] if rank == 0 else None
                work = dist.gather(make_input(case, rank, torch.float32, 9), outs, dst=0, async_op=True)
                later = [torch.zeros(9) for _ in range(world)] if rank == 0 else None
                dist.gather(make_input(f"{case}/later", rank, torch.float32, 9), later, dst=0)
                work.wait()
                for r in range(world if rank == 0 else 0):
                    assert_equal(outs[r], make_input(case, r, torch.float32, 9), f"{case} block {r}")
                    assert_equal(later[r], make_input(f"{case}/later", r, torch.float32, 9), f"{case} later {r}")
            else:
                scatter(case, torch.float32, count, None, False, root=0)
            took = compiled_calls() - before
            dist.barrier()
            if compiled_bytes and world > 1 and count * 4 <= compiled_bytes[name]:
                assert took >= 1, f"{case}: the compiled path did not take the call"

    cases.run(_LATE_ROOTED, late_peer_rooted)

    def gathers_back_to_back():
        # A gather's other ranks leave before its root has read their blocks, so their next call mostly finds the
        # root not yet at their last step: the compiled path waits for it as long as a first slice would (the
        # general path, taken otherwise, waits the same way, ten microseconds later). More than half of a run of them
        # there: 393-400 of 400 on an idle 2-core machine, 254 with a test suite running beside, 155-163 where the
        # front only looked.
        dist.barrier()
        before = compiled_calls()
        outs = [torch.zeros(4) for _ in range(world)] if rank == 0 else None
        for n in range(BACK_TO_BACK_CALLS):
            dist.gather(make_input(f"{_BACK_TO_BACK}/{n}", rank, torch.float32, 4), outs, dst=0)
            for r in range(world if rank == 0 else 0):
                assert_equal(outs[r], make_input(f"{_BACK_TO_BACK}/{n}", r, torch.float32, 4), f"{_BACK_TO_BACK}#{n}")
        took = compiled_calls() - before
        dist.barrier()
        if compiled_bytes and world > 1:
            assert took > BACK_TO_BACK_CALLS // 2, \
                f"{_BACK_TO_BACK}: the compiled path took {took} of {BACK_TO_BACK_CALLS} calls"

    cases.run(_BACK_TO_BACK, gathers_back_to_back)

    def list_forms_emptied_lists():
        # A caller of the group's own methods (torch's bindings pass lists of their own) empties its lists right
        # after an asynchronous list-form call, which the last rank's lateness leaves to the progress thread on
        # the ranks that wait for it: the Work keeps the call's tensors, which the rest writes and reads by
        # address, and gives them back as the call had them; freed, their memory would be the garbage's.
        count = 9
        for name, dtype, root in (("all_gather", torch.float32, None), ("gather", torch.float64, 0),
                                  ("scatter", torch.float32, world - 1), ("all_to_all", torch.float64, None)):
            case = f"{_KEPT_LISTS}/{name}"
            dist.barrier()
            calls[name](f"{case}/admitted", dtype, count, None, False, **({} if root is None else {"root": root}))
            dist.barrier()
            if rank == world - 1:
                time.sleep(0.35)
            mine = make_input(case, rank, dtype, count)
            if name == "all_gather":
                opts = c10d.AllgatherOptions()
                outs, ins = [[torch.zeros(count, dtype=dtype) for _ in range(world)]], [mine.clone()]
                expected = [[make_input(case, r, dtype, count) for r in range(world)]]
            elif name == "gather":
                opts = c10d.GatherOptions()
                opts.rootRank = root
                outs = [[torch.zeros(count, dtype=dtype) for _ in range(world)]] if rank == root else []
                ins = [mine.clone()]
                expected = [[make_input(case, r, dtype, count) for r in range(world)]] if rank == root else []
            elif name == "scatter":
                opts = c10d.ScatterOptions()
                opts.rootRank = root
                outs = [torch.zeros(count, dtype=dtype)]
                ins = [[make_input(f"{case}/{j}", root, dtype, count) for j in range(world)]] if rank == root else []
                expected = [make_input(f"{case}/{rank}", root, dtype, count)]
            else:
                opts = c10d.AllToAllOptions()
                outs = [torch.zeros(count, dtype=dtype) for _ in range(world)]
                ins = [make_input(f"{case}/{j}", rank, dtype, count) for j in range(world)]
                expected = [make_input(f"{case}/{rank}", r, dtype, count) for r in range(world)]
            opts.asyncOp = True
            method = {"all_gather": pg.allgather, "gather": pg.gather, "scatter": pg.scatter,
                      "all_to_all": pg.alltoall}[name]
            before = compiled_calls()
            work = method(outs, ins, opts)
            took = compiled_calls() - before
            for listed in (outs, ins):
                for inner in listed:
                    if type(inner) is list:
                        inner.clear()
                listed.clear()
            garbage = [torch.full((count,), 1e30, dtype=dtype) for _ in range(8 * world)]
            deadline = time.monotonic() + 30
            while not work.is_completed():
                assert time.monotonic() < deadline, f"{case}: never completed"
                time.sleep(0.001)
            work.wait()
            got = work.result()
            assert len(got) == len(expected), f"{case}: the Work's result has {len(got)} items for {len(expected)}"
            for item, want in zip(got, expected):
                if type(want) is list:
                    assert len(item) == world, f"{case}: the Work's result holds {len(item)} tensors, not {world}"
                    for r in range(world):
                        assert_equal(item[r], want[r], f"{case} block {r}")
                else:
                    assert_equal(item, want, case)
            assert all(bool((block == 1e30).all()) for block in garbage), f"{case}: a freed tensor was written"
            del work, got
            dist.barrier()
            if compiled_bytes and world > 1:
                assert took == 1, f"{case}: the compiled path took {took} calls"

    cases.run(_KEPT_LISTS, list_forms_emptied_lists)

    def alltoall_splits():
        # Uneven split sizes (some blocks empty) take the compiled path as even ones do, rows of 3 elements; split
        # sizes that disagree between ranks raise on every rank, naming the pair, and the group stays usable.
        from shmcoll.errors import SizesDisagreeError

        table = [[(r + 2 * j) % 3 for j in range(world)] for r in range(world)]  # rows rank r sends rank j
        rows = lambda r, j: make_input(f"{_SPLITS}/{r}/{j}", r, torch.float64, 3 * table[r][j]).reshape(-1, 3)
        for n in range(2):  # the first admits the plan
            before = compiled_calls()
            out = torch.zeros(sum(table[r][rank] for r in range(world)), 3, dtype=torch.float64)
            dist.all_to_all_single(out, torch.cat([rows(rank, j) for j in range(world)]),
                                   [table[r][rank] for r in range(world)], table[rank])
            assert_equal(out, torch.cat([rows(r, rank) for r in range(world)]), f"{_SPLITS}#{n}")
        if compiled_bytes:
            assert pg._small.taken == before + 1, f"{_SPLITS}: the compiled path did not take uneven splits"
        if world < 2:
            return
        expects = [table[r][rank] + (rank == 1 and r == 0) for r in range(world)]  # rank 1: a row more from 0
        out = torch.zeros(sum(expects), 3, dtype=torch.float64)
        before = compiled_calls()
        try:
            dist.all_to_all_single(out, torch.cat([rows(rank, j) for j in range(world)]), expects, table[rank])
        except SizesDisagreeError as error:
            assert "rank 0 sends" in str(error) and "to rank 1" in str(error), f"{_SPLITS}: {error}"
        else:
            raise AssertionError(f"{_SPLITS}: split sizes that disagree raised nothing")
        if compiled_bytes:
            assert pg._small.taken == before + 1, f"{_SPLITS}: the compiled path did not take the call that disagrees"
        assert not out.any(), f"{_SPLITS}: a call whose sizes disagree wrote its output"
        dist.all_reduce(torch.ones(1))  # still usable

    cases.run(_SPLITS, alltoall_splits)

    # The barrier takes the compiled path from its first call (it has no plan to admit); a late peer's barrier
    # must still hold everyone back (finish of shmcoll.algorithms.barrier, after the first slice).
    for async_op, late in BARRIERS:
        case = f"fast_path/barrier/async={async_op}/late={late}"

        def barrier_call():
            before = compiled_calls()
            seq = pg._state.seq
            if late and rank == world - 1:
                time.sleep(0.35)
            start = time.monotonic()
            work = dist.barrier(async_op=async_op)
            if async_op:
                work.wait()
            held = time.monotonic() - start
            took = compiled_calls() - before
            assert took == (1 if compiled_bytes else 0), f"{case}: the compiled path took {took} calls"
            assert pg._state.seq == seq + 1 and pg.describe_current() == f"barrier() #{seq + 1}", \
                f"{case}: the group's bookkeeping says {pg.describe_current()!r} after call #{seq + 1}"
            assert not late or rank == world - 1 or held > 0.25, f"{case}: the barrier let rank {rank} go after " \
                f"{held:.3f} s, before the late rank came"

        cases.run(case, barrier_call)


def fast_paths_cases() -> int:
    """How many cases ``fast_paths`` runs on each rank (with the one-lane compiled path it checks one more:
    that every_op took it)."""
    every_op = sum(len(ops_for(dtype)) for dtype in EVERY_OP_DTYPES) * 2 * len(REDUCING)  # sync and async
    return len(CALLS) * len(VARIANTS) + every_op + len(OTHER_CASES) + len(LATE_PEER_CALLS) + len(BARRIERS)
