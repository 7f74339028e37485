#!/usr/bin/env python3
"""FSDP2 (fully_shard) training of a small transformer on CPU: an example of the shm backend and a benchmark.

    torchrun --nproc_per_node=2 examples/fsdp2.py --backend shm
    torchrun --nproc_per_node=2 examples/fsdp2.py --backend gloo

A decoder-only transformer (causal self-attention and an MLP per block) learns
next-token prediction on synthetic sequences: arithmetic progressions modulo
the vocabulary, each with its own start and stride, so the loss falls from
ln(vocab) as the model learns to read the stride off the context. Every rank
draws its own sequences from a generator seeded by (--seed, rank).

Each block and then the whole model are wrapped with ``fully_shard`` over a 1-D
CPU DeviceMesh of all ranks (``init_device_mesh("cpu", (world,))``, which uses
the default process group, hence --backend): every rank stores 1/world of the
parameters, all-gathers a block's parameters before its forward and backward,
and reduce-scatters its gradients after. Rank 0 prints the loss (the mean over
ranks) every --log-every steps and, at the end, the median step time, steps/s
and the final loss, which with two ranks is the same on shm and Gloo.
"""
from __future__ import annotations

import gc

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import _common


class Block(nn.Module):
    """Pre-norm transformer block: causal multi-head self-attention, then a 4x MLP, each with a residual."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp_norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = (self.qkv(self.attn_norm(x)).view(batch, seq, 3, self.heads, dim // self.heads)
                   .permute(2, 0, 3, 1, 4))  # 3 x [batch, heads, seq, head_dim]
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, max_seq: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(max_seq, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [batch * seq, vocab] for tokens [batch, seq].

        Flat, because a [batch, seq, vocab] result of the head would be a view
        of its 2-D matmul, and FSDP2 warns about a root module returning a view
        (an in-place op on it would skip the backward hook).
        """
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).flatten(0, 1))


def progressions(batch: int, seq: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """[batch, seq + 1] tokens: (start + stride * t) mod vocab, start and stride (1..8) drawn per sequence."""
    start = torch.randint(0, vocab, (batch, 1), generator=generator)
    stride = torch.randint(1, 9, (batch, 1), generator=generator)
    return (start + stride * torch.arange(seq + 1)) % vocab


def main() -> None:
    p = _common.training_parser(__doc__, steps=20, warmup=3, optimizer="AdamW")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step (default 8)")
    p.add_argument("--seq", type=int, default=64, help="tokens per sequence (default 64)")
    p.add_argument("--dim", type=int, default=256, help="model width (default 256)")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    p.add_argument("--heads", type=int, default=4, help="attention heads, dividing --dim (default 4)")
    p.add_argument("--vocab", type=int, default=512, help="vocabulary size (default 512)")
    args = p.parse_args()
    if args.steps < 1 or args.dim % args.heads:
        p.error("--steps must be at least 1 and --heads must divide --dim")

    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = _common.set_threads(args.threads)
    mesh = init_device_mesh("cpu", (world,))

    torch.manual_seed(args.seed)  # the same initial weights on every rank: fully_shard keeps each rank's slice
    model = TinyLM(args.vocab, args.dim, args.layers, args.heads, args.seq)
    params = sum(p.numel() for p in model.parameters())
    for block in model.blocks:
        fully_shard(block, mesh=mesh)  # one all-gather / reduce-scatter per block, overlapped with the others
    fully_shard(model, mesh=mesh)  # the rest (embeddings, final norm, head)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(args.seed * 1_000_003 + rank)  # each rank its own stream
    _common.banner("fsdp2", args, threads,
                          f"transformer {args.layers}x{args.dim} ({params / 1e6:.2f} M params), "
                          f"batch {args.batch}x{args.seq} tokens/rank")

    def train_step(tokens):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:].reshape(-1))
        loss.backward()  # the gradient reduce-scatters finish before backward returns
        opt.step()
        return loss

    _common.train("fsdp2", args, threads, params, lambda: progressions(args.batch, args.seq, args.vocab, data),
                  train_step)
    # As in ddp.py: drop the sharded model (it holds the device mesh and so the
    # process group) while the interpreter is whole; left to interpreter shutdown, Gloo's
    # group is destroyed there and a rank may abort after the results are out.
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
