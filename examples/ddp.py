#!/usr/bin/env python3
"""DDP training of an MLP on synthetic data: an example of the shm backend and a small benchmark.

    torchrun --nproc_per_node=2 examples/ddp.py --backend shm
    torchrun --nproc_per_node=2 examples/ddp.py --backend gloo     # the same losses

Every rank draws its own batches from a generator seeded by (--seed, rank) and
regresses the output of a fixed random "teacher" network, so the loss falls
and every run with the same seed and world size trains on the same data,
whatever the backend. Rank 0 prints the loss (the mean over ranks) every
--log-every steps and, at the end, the median step time, steps/s and the final
loss. With two ranks the gradient sums are bit-identical on shm and Gloo, so
are the losses; with more ranks they may differ in the last digits, because the
backends add the ranks' gradients in different orders.

The default model (--hidden 1024 --layers 4: 2.4 M parameters, so 10 MB of
gradients to all-reduce per step) takes a few tens of ms per step on one core;
--hidden and --layers scale it.
"""
from __future__ import annotations

import gc

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import _common

IN_FEATURES = 256
OUT_FEATURES = 64


def mlp(hidden: int, layers: int) -> nn.Sequential:
    """``layers`` Linear layers (IN -> hidden -> ... -> hidden -> OUT) with ReLU between them."""
    widths = [IN_FEATURES] + [hidden] * (layers - 1) + [OUT_FEATURES]
    modules: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        modules.append(nn.Linear(a, b))
        if i < layers - 1:
            modules.append(nn.ReLU())
    return nn.Sequential(*modules)


class Teacher:
    """A fixed random function for the student to learn; the same on every rank (seeded by --seed only)."""

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.a = torch.randn(IN_FEATURES, 128, generator=g) / IN_FEATURES ** 0.5
        self.b = torch.randn(128, OUT_FEATURES, generator=g) / 128 ** 0.5

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.a) @ self.b


def main() -> None:
    p = _common.training_parser(__doc__, steps=30, warmup=5, optimizer="Adam")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step (default 64)")
    p.add_argument("--hidden", type=int, default=1024, help="width of the hidden layers (default 1024)")
    p.add_argument("--layers", type=int, default=4, help="Linear layers, at least 2 (default 4)")
    args = p.parse_args()
    if args.steps < 1 or args.layers < 2:
        p.error("--steps must be at least 1 and --layers at least 2")

    dist.init_process_group(backend=args.backend)
    rank = dist.get_rank()
    threads = _common.set_threads(args.threads)

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = DDP(mlp(args.hidden, args.layers))
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()
    teacher = Teacher(args.seed)
    data = torch.Generator().manual_seed(args.seed * 1_000_003 + rank)  # each rank its own stream
    _common.banner("ddp", args, threads,
                          f"MLP {args.layers}x{args.hidden} ({params / 1e6:.2f} M params), batch {args.batch}/rank")

    def next_batch():
        x = torch.randn(args.batch, IN_FEATURES, generator=data)
        return x, teacher(x)

    def train_step(batch):
        x, y = batch
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()  # DDP's gradient all_reduce runs (and is waited for) inside backward
        opt.step()
        return loss

    _common.train("ddp", args, threads, params, next_batch, train_step)
    # Free the DDP model (its reducer holds the process group; reference cycles
    # keep it alive until a collection) while the interpreter is whole. Left to
    # interpreter shutdown, Gloo's group is destroyed there, and a rank may abort
    # ("terminate called without an active exception") after the results are
    # out: 8 of 42 runs at 2 ranks with torch 2.13, none of 40 with this; none
    # of 22 runs on shm without it.
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
