"""Barrier: publish a step that carries no data and wait for everyone to reach it."""


def barrier(arena, desc: int) -> None:
    step = arena.next_step()
    arena.post(step, desc)
    arena.wait_all(step)
    arena.check_same_collective(step, desc)
