#!/usr/bin/env python3
"""A DLRM-like step, shm against gloo in one job: DDP over a sparse embedding table (BENCHMARKS.md, "Sparse DDP,
DLRM-like").

    .venv/bin/torchrun --nproc_per_node=2 bench/bench_dlrm.py --json results/dlrm-2ranks.json
    .venv/bin/torchrun --nproc_per_node=4 bench/bench_dlrm.py --json results/dlrm-4ranks.json

Model: ``nn.EmbeddingBag(--rows, --dim, mode="sum", sparse=True)`` (default 1M x 64: 256 MiB
of float32) feeding an MLP (dim -> 256 -> 256 -> 1), BCE loss, SGD (which takes the table's
sparse gradient as it is). Each rank looks up --bags bags of --per-bag rows per step (default
2048 x 4 = 8192 lookups), drawn from a skewed distribution, as click logs are. DDP all-reduces
the table's sparse COO gradient (every rank's indices and values, summed: what Gloo does) and
the MLP's dense one.

Three copies start from the same weights: DDP over the default group (shm), DDP over
``new_group(backend="gloo")``, and the model alone ("local": no communication, the compute
floor). After --warmup steps each, rounds alternate shm, gloo, local (--rounds x --steps).
Step time = the slowest rank's. Then, on the sparse gradient of the last step as DDP sends
it: ``all_reduce`` alone, interleaved shm/gloo (--sparse-rounds rounds of --reps calls, each on a
fresh copy, timed alone; a round's time is its slowest rank's mean, the figure the rounds' median:
one call is ~1 ms here, so a few slow rounds on a shared VM must not decide it); its result must
be Gloo's bit for bit. At the end, the shm and gloo copies must hold the
same weights (exit 3 if they differ by more than 1e-5 relative), and every rank reports its
resident memory.
"""
from __future__ import annotations

import copy
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

# bench/ is on the path of a script run from it
from bench_ddp import add_round_options, alternating_rounds, print_step_times
from shmcoll_bench import script

EXIT_MISMATCH = 3
GOAL_SPARSE_SPEEDUP = 5.0


class DLRMish(torch.nn.Module):
    def __init__(self, rows: int, dim: int):
        super().__init__()
        self.table = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                       torch.nn.ReLU(), torch.nn.Linear(256, 1))

    def forward(self, indices, offsets):
        return self.mlp(self.table(indices, offsets)).squeeze(1)


def batches(rank: int, count: int, bags: int, per_bag: int, rows: int) -> list:
    """Deterministic (indices, offsets, labels) per step and rank; a skewed (power-law) row choice."""
    out = []
    for step in range(count):
        g = torch.Generator().manual_seed(1000 * step + rank)
        u = torch.rand(bags * per_bag, generator=g, dtype=torch.float64)
        indices = (rows * u.pow(3)).long().clamp_(max=rows - 1)
        offsets = torch.arange(0, bags * per_bag, per_bag)
        labels = torch.randint(0, 2, (bags,), generator=g).float()
        out.append((indices, offsets, labels))
    return out


def train_step(model, optimizer, data) -> float:
    indices, offsets, labels = data
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(indices, offsets), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


def rss_mib() -> tuple[float, float]:
    """(resident now, peak) of this process, MiB."""
    with open("/proc/self/status") as f:
        now = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return now / 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    p = script.parser(__doc__)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--bags", type=int, default=2048, help="bags per rank per step")
    p.add_argument("--per-bag", type=int, default=4, help="lookups per bag")
    add_round_options(p, warmup=2, rounds=3, steps=3)
    p.add_argument("--sparse-rounds", type=int, default=15,
                   help="rounds of the sparse all_reduce alone, shm and gloo alternated (their median is reported)")
    p.add_argument("--reps", type=int, default=10, help="sparse all_reduce calls per round")
    args = p.parse_args()

    job = script.start(args.threads)
    rank, world, groups, ctrl = job.rank, job.world, job.groups, job.ctrl

    torch.manual_seed(0)
    base = DLRMish(args.rows, args.dim)
    models = {name: DDP(copy.deepcopy(base), process_group=group) for name, group in groups.items()}
    models["local"] = base
    optimizers = {name: torch.optim.SGD(model.parameters(), lr=0.05) for name, model in models.items()}
    total = args.warmup + args.rounds * args.steps
    data = batches(rank, total, args.bags, args.per_bag, args.rows)

    _, step_s = alternating_rounds(models, optimizers, data, train_step, args.warmup, args.rounds, args.steps, ctrl)

    # The sparse gradient as DDP hands it to the group (uncoalesced, this rank's lookups).
    grad = models["local"].table.weight.grad
    sparse_times = {"shm": [], "gloo": []}
    results = {}
    # Each call on a fresh copy made outside the timing, the last one dropped first (as DDP's
    # gradient is, step after step): holding every copy would time page faults of new memory.
    for r in range(args.sparse_rounds):
        for name, group in groups.items():
            spent = 0.0
            for _ in range(args.reps):
                g = None
                g = grad.clone()
                dist.barrier(group=ctrl)
                start = time.perf_counter()
                dist.all_reduce(g, group=group)
                spent += time.perf_counter() - start
            sparse_times[name].append(spent / args.reps)
            results[name] = g.coalesce()
    # Gloo's sum, bit for bit (the same additions in the same order).
    same_sum = torch.equal(results["shm"].indices(), results["gloo"].indices()) and \
        torch.equal(results["shm"].values(), results["gloo"].values())

    # Same weights after the same steps?
    worst = 0.0
    for (_, a), (_, b) in zip(models["shm"].module.named_parameters(), models["gloo"].module.named_parameters()):
        worst = max(worst, ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item())
    now, peak = rss_mib()

    sp = torch.tensor([sparse_times["shm"], sparse_times["gloo"]], dtype=torch.float64)
    dist.all_reduce(sp, op=dist.ReduceOp.MAX, group=ctrl)
    flags = torch.tensor([worst, float(not same_sum)], dtype=torch.float64)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=ctrl)
    worst, sums_differ = flags.tolist()
    memory = torch.tensor([now, peak], dtype=torch.float64)
    mems = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(mems, memory, group=ctrl)

    code = EXIT_MISMATCH if worst > 1e-5 or sums_differ else 0
    if rank == 0:
        sparse_med = {"shm": statistics.median(sp[0].tolist()), "gloo": statistics.median(sp[1].tolist())}
        sparse_speedup = sparse_med["gloo"] / sparse_med["shm"]
        nnz, width = grad._nnz(), args.dim
        print(f"DLRM-like DDP step: EmbeddingBag({args.rows}, {args.dim}, sparse) + MLP, {args.bags} bags x "
              f"{args.per_bag} lookups per rank, {world} ranks, {args.threads} torch thread(s) per rank, "
              f"{os.cpu_count()} CPUs, torch {torch.__version__}\n")
        med = print_step_times(step_s)
        print(f"\nsparse all_reduce of the table's gradient ({nnz} rows x {width} float32 per rank, "
              f"{nnz * (width * 4 + 8) / 2**20:.1f} MiB of indices + values): shm "
              f"{sparse_med['shm'] * 1e3:.2f} ms, gloo {sparse_med['gloo'] * 1e3:.2f} ms: {sparse_speedup:.1f}x "
              f"(goal >= {GOAL_SPARSE_SPEEDUP:g}x: {'met' if sparse_speedup >= GOAL_SPARSE_SPEEDUP else 'not met'})")
        print(f"step: gloo/shm {med['gloo'] / med['shm']:.2f}x")
        print(f"weights after {total} steps: max relative difference shm vs gloo {worst:.2e}; "
              f"sparse sums {'equal' if not sums_differ else 'DIFFER'}")
        print("resident memory per rank (MiB, now / peak): "
              + ", ".join(f"rank {r}: {m[0]:.0f} / {m[1]:.0f}" for r, m in enumerate(mems))
              + " (three copies of the model: shm, gloo, local)")
        if code:
            print("error: shm and gloo trained to different weights", file=sys.stderr)
        script.write_json(args.json, {
            "bench": "dlrm", "config": vars(args), "world_size": world, "cpus": os.cpu_count(),
            "torch": torch.__version__, "step_s": step_s, "median_step_s": med,
            "sparse_allreduce_s": {"shm": sp[0].tolist(), "gloo": sp[1].tolist()},
            "sparse_speedup_gloo_over_shm": sparse_speedup, "grad_nnz_per_rank": nnz,
            "weights_max_rel_diff": worst, "rss_mib_now_peak": [m.tolist() for m in mems]})
    return script.finish(ctrl, code)


if __name__ == "__main__":
    sys.exit(main())
