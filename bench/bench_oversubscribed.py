"""More ranks than cores: how a collective's time follows where the kernel put the ranks.

    torchrun --nproc_per_node=4 bench/bench_oversubscribed.py [--ops broadcast,all_gather_into_tensor]
        [--bytes 256K] [--rounds 16] [--iters 1000] [--pin]
    mpirun -n 4 --oversubscribe --bind-to none --mca btl self,sm \
        .venv/bin/python bench/bench_oversubscribed.py --mpi      # the same calls on Open MPI

With 4 ranks on 2 cores, two ranks share a core when the load is even; the kernel
sometimes leaves three on one core for tens of milliseconds (it does not move a task
that ran in the last half millisecond, and a rank that waits by yielding always has),
and a collective then takes the time of the crowded core. This prints, per round of
``--iters`` calls, each rank's time per call and the CPU it ran on at the start and at
the end of the round (``/proc/self/stat``), then the median per placement (the ranks'
CPUs, e.g. ``0 1 1 0``): what explains a benchmark of 0.1 s rounds (the README main job)
that moves from run to run by more than its other noise. The sweeps' calls and sizes
(``shmcoll_bench.cases``: all_gather's output, reduce_scatter's input; ``shmcoll_bench.mpi``
for Open MPI's). ``--pin``: the sweeps' pinning (``shmcoll_bench.timing.pin``).

``--crowd``: how fast the ranks spread out again from the worst placement. Each round puts
every rank but the last on the first CPU for 300 calls (affinity), gives every rank its whole
mask back, then runs 250 windows of 20 calls; it prints how long the kernel took to spread
the ranks evenly over the CPUs (each CPU within one rank of the others; "never" if it did not
within the round) and the mean time per call over the round. Where ranks outnumber cores a
shm rank alone on its core sleeps instead of yielding (docs/DESIGN.md, "Waits"), which lets
the kernel move a rank onto its core sooner.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import time

import torch
import torch.distributed as dist

from shmcoll_bench import mpi, timing
from shmcoll_bench.cases import OpCase, counts_for
from shmcoll_bench.sweep import parse_bytes


def cpu() -> int:
    """The CPU this process last ran on (field 39 of /proc/self/stat)."""
    with open("/proc/self/stat") as f:
        return int(f.read().rpartition(")")[2].split()[36])


class Torch:
    """The calls and the control plane on the default torch.distributed group (shm)."""

    def __init__(self):
        dist.init_process_group("shm")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def call(self, op: str, nbytes: int):
        case = OpCase(op, counts_for(op, nbytes, 4, self.world), torch.float32, self.world, self.rank)
        return case.fn(None, *case.alloc())

    def barrier(self) -> None:
        dist.barrier()

    def gather(self, rows):
        everyone = [None] * self.world
        dist.all_gather_object(everyone, rows)
        return everyone

    def close(self) -> None:
        dist.destroy_process_group()


class Mpi:
    """The same on MPI_COMM_WORLD (run under mpirun)."""

    def __init__(self):
        from mpi4py import MPI

        self.comm = MPI.COMM_WORLD
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()

    def call(self, op: str, nbytes: int):
        case = OpCase(op, counts_for(op, nbytes, 4, self.world), torch.float32, self.world, self.rank)
        return mpi.op_call(self.comm, op, *mpi.buffers(case))

    def barrier(self) -> None:
        self.comm.Barrier()

    def gather(self, rows):
        return self.comm.allgather(rows)

    def close(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="broadcast,all_gather_into_tensor")
    parser.add_argument("--bytes", default="256K")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--mpi", action="store_true", help="Open MPI through mpi4py (start under mpirun)")
    parser.add_argument("--pin", action="store_true", help="pin local rank r to CPU r mod (CPUs)")
    parser.add_argument("--crowd", action="store_true",
                        help="time the spreading out from all ranks but one on the first CPU (see above)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.pin:
        timing.pin(int(os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))))
    group = Mpi() if args.mpi else Torch()
    rank, world = group.rank, group.world
    nbytes = parse_bytes(args.bytes)
    for op in args.ops.split(","):
        call = group.call(op, nbytes)
        for _ in range(max(50, args.iters // 4)):
            call()
        if args.crowd:
            crowd(group, op, nbytes, call, args.rounds)
            continue
        rows = []
        for _ in range(args.rounds):
            group.barrier()
            start, t0 = cpu(), time.perf_counter()
            for _ in range(args.iters):
                call()
            rows.append(((time.perf_counter() - t0) / args.iters * 1e6, start, cpu()))
        everyone = group.gather(rows)
        if rank == 0:
            print(f"\n{'Open MPI' if args.mpi else 'shm'} {op}, {nbytes} bytes, {world} ranks: us per call "
                  f"(rank: cpu at start->end)")
            by_placement = collections.defaultdict(list)
            for i in range(args.rounds):
                slowest = max(everyone[r][i][0] for r in range(world))
                cells = "  ".join(f"{everyone[r][i][0]:6.1f} (cpu{everyone[r][i][1]}->{everyone[r][i][2]})"
                                  for r in range(world))
                print(f"round {i:2d}: {cells}")
                if all(everyone[r][i][1] == everyone[r][i][2] for r in range(world)):  # no rank moved
                    by_placement[" ".join(str(everyone[r][i][1]) for r in range(world))].append(slowest)
            print("median of the slowest rank per placement (rounds in which no rank moved):")
            for placement, times in sorted(by_placement.items(), key=lambda kv: statistics.median(kv[1])):
                print(f"  cpus {placement}: {statistics.median(times):6.1f} us over {len(times)} round(s)")
    group.close()


def crowd(group, op: str, nbytes: int, call, rounds: int, windows: int = 250, per_window: int = 20) -> None:
    """``--crowd``: per round, the time until the ranks are spread evenly again and the mean per call."""
    mask = sorted(os.sched_getaffinity(0))
    if len(mask) < 2:
        raise SystemExit("--crowd needs at least 2 CPUs in the affinity mask")
    last = group.rank == group.world - 1
    for i in range(rounds):
        os.sched_setaffinity(0, {mask[1]} if last else {mask[0]})
        for _ in range(300):
            call()
        os.sched_setaffinity(0, mask)
        rows = []
        for _ in range(windows):
            t0 = time.perf_counter()
            for _ in range(per_window):
                call()
            rows.append((time.perf_counter() - t0, cpu()))
        everyone = group.gather(rows)
        if group.rank == 0:
            elapsed, spread_at = 0.0, None
            for w in range(windows):
                counts = collections.Counter(everyone[r][w][1] for r in range(group.world))
                per_cpu = [counts.get(c, 0) for c in mask]
                if spread_at is None and max(per_cpu) - min(per_cpu) <= 1:
                    spread_at = elapsed
                elapsed += max(everyone[r][w][0] for r in range(group.world))
            spread = "never" if spread_at is None else f"{spread_at * 1e3:6.1f} ms"
            print(f"{op} {nbytes} B, round {i:2d}: spread out after {spread}; "
                  f"{elapsed / (windows * per_window) * 1e6:6.1f} us per call over {elapsed * 1e3:.0f} ms", flush=True)


if __name__ == "__main__":
    main()
