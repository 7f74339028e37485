"""Barrier: publish a step that carries no data and wait for everyone to reach it."""


def barrier(arena, desc: int) -> None:
    step = arena.next_step()
    arena.post(step, desc)
    finish(arena, step, desc)


def finish(arena, step: int, desc: int) -> None:
    """Once ``step`` is posted (here, or by the compiled barrier, ``_front.SmallCollectives.barrier``, whose
    first wait ended with its slice or found a peer in another collective): wait (slowly) for every rank to
    reach it, and raise if one posted it for another collective."""
    arena.wait_all(step)
    arena.check_same_collective(step, desc)
