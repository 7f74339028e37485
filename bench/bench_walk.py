#!/usr/bin/env python3
"""The walk of one ``dist.all_reduce(t)``: which shmcoll modules it enters, and how many calls it makes there.

    .venv/bin/torchrun --nproc_per_node=2 bench/bench_walk.py

One call of each size after three warm-up calls, under ``sys.setprofile``; rank 0 prints a line per
size. A layer added to the path shows here as a module more (docs/DESIGN.md, "The path of one all_reduce").
"""
import sys

import torch
import torch.distributed as dist


def walk(tensor: torch.Tensor) -> tuple[list[str], int]:
    for _ in range(3):
        dist.all_reduce(tensor)
    modules, calls = [], 0

    def profile(frame, event, arg):
        nonlocal calls
        module = frame.f_globals.get("__name__", "")
        if event == "call" and module.startswith("shmcoll"):
            calls += 1
            if module not in modules:
                modules.append(module)

    sys.setprofile(profile)
    dist.all_reduce(tensor)
    sys.setprofile(None)
    return modules, calls


def main() -> None:
    dist.init_process_group("shm")
    lines = []
    for nbytes in (8, 1 << 20):
        modules, calls = walk(torch.ones(nbytes // 4))
        lines.append(f"{nbytes} B: {len(modules)} modules, {calls} calls: "
                     + ", ".join(m.removeprefix("shmcoll.") for m in modules))
    if dist.get_rank() == 0:
        print("\n".join(lines))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
