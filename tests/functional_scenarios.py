"""Functional collectives (``torch.distributed._functional_collectives``, what DTensor, FSDP2 and compiled code
call) on shm, against the same calls on a Gloo group beside it, eager and compiled.

Each call's result is a tensor whose collective completes when it is first used (``wait_tensor``), so a job
issues them all before using any: several of shm's Works are pending in torch's registry at once. Compiled
(``aot_eager``), the same function runs twice after its first call compiled it, so the compiled code's calls are
those checked. Sizes: 8 elements (the small compiled paths) and 20011 (past one 4 KiB chunk, with the job's
small chunks).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def _data(rank: int, count: int, tag: int) -> torch.Tensor:
    """Exact in float32 and different per rank, position and tag."""
    return torch.arange(count, dtype=torch.float32) % 89 + 1000 * rank + 100 * tag


def _calls(group, rank: int, world: int, count: int) -> list[torch.Tensor]:
    issued = [
        funcol.all_reduce(_data(rank, count, 1), "sum", group),
        funcol.all_reduce(_data(rank, count, 2), "max", group),
        funcol.all_gather_tensor(_data(rank, count, 3), 0, group),
        funcol.reduce_scatter_tensor(_data(rank, count * world, 4), "sum", 0, group),
        funcol.broadcast(_data(rank, count, 5), world - 1, group),
        funcol.all_to_all_single(_data(rank, count * world, 6), None, None, group),
    ]
    return [t * 1 for t in issued]  # each used only now, after every call was issued


def functional(cases):
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    shm = dist.group.WORLD
    for count in (8, 20011):
        expected = _calls(gloo, rank, world, count)
        cases.run(f"eager/{count}", lambda: _equal(_calls(shm, rank, world, count), expected, "eager"))

        compiled = torch.compile(lambda: _calls(shm, rank, world, count), backend="aot_eager")

        def run_compiled():
            for _ in range(3):  # the first call compiles; the later ones run the compiled code
                _equal(compiled(), expected, "compiled")

        cases.run(f"compiled/{count}", run_compiled)
        torch._dynamo.reset()

    def taken_by_the_front():
        # A functional all_gather or reduce_scatter reaches the group as an asynchronous coalesced call of one
        # pair; on one node the compiled front takes it as the plain call (its plan admitted by the calls above).
        # Each is used before the next is issued: a call whose rest went to the progress thread (ranks outnumber
        # the cores) leaves the next one to the general path.
        before = shm._small.taken
        issued = [funcol.all_gather_tensor(_data(rank, 8, 7), 0, shm) * 1]
        issued.append(funcol.reduce_scatter_tensor(_data(rank, 8 * world, 8), "sum", 0, shm) * 1)
        took = shm._small.taken - before
        expected = [funcol.all_gather_tensor(_data(rank, 8, 7), 0, gloo),
                    funcol.reduce_scatter_tensor(_data(rank, 8 * world, 8), "sum", 0, gloo)]
        _equal(issued, [t * 1 for t in expected], "front")
        assert took == 2, f"the compiled front took {took} of the 2 functional calls"

    if hasattr(shm._small, "taken"):  # one node's arena: the compiled front
        cases.run("front/8", taken_by_the_front)
    dist.destroy_process_group(gloo)


def _equal(actual, expected, what: str) -> None:
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.shape == e.shape and torch.equal(a, e), f"{what} call {i}: {a} != {e}"
