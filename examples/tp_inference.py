#!/usr/bin/env python3
"""Tensor-parallel bfloat16 decoding, as CPU LLM serving does it: an example of the shm backend and a benchmark.

    torchrun --nproc_per_node=2 examples/tp_inference.py --backend shm
    torchrun --nproc_per_node=2 examples/tp_inference.py --backend gloo

Each of --layers layers is the MLP half of a transformer block, split over the
ranks Megatron style:

    h       = rms_norm(x)                      x: [batch, hidden], the same on every rank
    a       = gelu(h @ W_up[shard].T)          column parallel: rank r holds ~1/world of W_up's rows
    partial = a @ W_down[:, shard].T           row parallel: rank r holds the same share of W_down's columns
    x       = x + all_reduce(partial, SUM)     the one collective per layer: [batch, hidden] bfloat16

Every decode step runs the hidden state through all layers and feeds the
normalised result back in (a stand-in for sampling a token and embedding it;
attention and its KV cache are left out: they add compute, not collectives of
another kind). The all_reduce is a small, latency-bound message on the critical
path of every layer, which is where a backend's per-call cost shows.

Before timing, the first decode step is checked against the same computation
with the full weights on one rank; the run fails (exit 3) if the relative
error exceeds what bfloat16 rounding explains. Rank 0 then prints tokens/s
(--batch sequences, one token each per step), the mean time of one all_reduce
and the share of the decode time spent in all_reduce (both the mean over
ranks; a rank's all_reduce time includes waiting for the slower rank).
"""
from __future__ import annotations

import math
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import _common

EXIT_MISMATCH = 3
# Allowed relative error (Frobenius norm of the difference over that of the
# reference) of the hidden state after one decode step, per sqrt(layer).
# Tensor parallelism rounds each rank's partial product to bfloat16 before the
# sum, the single-rank reference rounds the whole product once, and the
# residual stream is rounded to bfloat16 after every layer; these independent
# roundings add up like a random walk. Measured (hidden 512 and 1024, 2 and 4
# ranks, 1 to 32 layers): 2.6e-3 x sqrt(layers). A wrong all_reduce (one
# share missing) gives 0.25 to 0.9 at 4 ranks or fewer.
REL_TOLERANCE_PER_SQRT_LAYER = 1e-2


def layer_weights(seed: int, layer: int, hidden: int, ffn: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The full bfloat16 weights (W_up [ffn, hidden], W_down [hidden, ffn]) of a layer, from (seed, layer) alone."""
    g = torch.Generator().manual_seed(seed * 100_003 + layer)
    w_up = torch.randn(ffn, hidden, generator=g) / math.sqrt(hidden)
    w_down = torch.randn(hidden, ffn, generator=g) / math.sqrt(ffn)
    return w_up.to(torch.bfloat16), w_down.to(torch.bfloat16)


def mlp_block(x: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """One layer's contribution with these weights: the full output, or a rank's partial sum of it."""
    h = F.rms_norm(x, (x.shape[-1],))
    return F.linear(F.gelu(F.linear(h, w_up)), w_down)


class TensorParallelMLP:
    """This rank's shards of every layer, and the decode step that combines them with all_reduce."""

    def __init__(self, shards: list[tuple[torch.Tensor, torch.Tensor]]):
        self.shards = shards
        self.all_reduce_seconds = 0.0
        self.all_reduce_calls = 0

    def step(self, x: torch.Tensor) -> torch.Tensor:
        for w_up, w_down in self.shards:
            partial = mlp_block(x, w_up, w_down)
            start = time.perf_counter()
            dist.all_reduce(partial)
            self.all_reduce_seconds += time.perf_counter() - start
            self.all_reduce_calls += 1
            x = x + partial
        return F.rms_norm(x, (x.shape[-1],))


def build(args, rank: int, world: int, x0: torch.Tensor) -> tuple[TensorParallelMLP, torch.Tensor]:
    """This rank's shards, and the single-rank reference of the first decode step.

    Each layer's full weights are made, sliced and used for the reference one
    layer at a time, so a rank never holds more than one layer's full weights
    (a real server would load only its shards from the checkpoint).
    """
    # Rank r's share of the ffn dimension; the first ffn % world ranks get one more row.
    per_rank, extra = divmod(args.ffn, world)
    first = rank * per_rank + min(rank, extra)
    rows = slice(first, first + per_rank + (rank < extra))
    shards, reference = [], x0
    for layer in range(args.layers):
        w_up, w_down = layer_weights(args.seed, layer, args.hidden, args.ffn)
        shards.append((w_up[rows].contiguous(), w_down[:, rows].contiguous()))
        reference = reference + mlp_block(reference, w_up, w_down)
    return TensorParallelMLP(shards), F.rms_norm(reference, (args.hidden,))


def check(model: TensorParallelMLP, x0: torch.Tensor, expected: torch.Tensor,
          tolerance: float) -> tuple[bool, float]:
    """Every rank compares its first decode step with the reference; it passes only if it does on all ranks."""
    got = model.step(x0).float()
    rel_error = ((got - expected.float()).norm() / expected.float().norm()).item()
    worst = torch.tensor([rel_error], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    # NaN compares False, so a NaN error fails the check too.
    return bool(worst.item() <= tolerance), worst.item()


def decode_arguments(doc: str):
    """The options of a decoding example (this one and tp_dtensor.py), parsed."""
    p = _common.parser(doc)
    p.add_argument("--tokens", type=int, default=64, help="timed decode steps (default 64)")
    p.add_argument("--warmup", type=int, default=8, help="untimed decode steps before them (default 8)")
    p.add_argument("--layers", type=int, default=8, help="layers, one all_reduce each (default 8)")
    p.add_argument("--hidden", type=int, default=1024, help="hidden size (default 1024)")
    p.add_argument("--ffn", type=int, default=None,
                   help="MLP inner size, split over the ranks (default 4 x hidden)")
    p.add_argument("--batch", type=int, default=4, help="sequences decoded together (default 4)")
    args = p.parse_args()
    args.ffn = args.ffn or 4 * args.hidden
    if args.tokens < 1 or args.layers < 1:
        p.error("--tokens and --layers must be at least 1")
    return args


def main() -> None:
    args = decode_arguments(__doc__)

    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = _common.set_threads(args.threads)

    # The "prompt": the same hidden state on every rank, as after a replicated embedding.
    x0 = torch.randn(args.batch, args.hidden, generator=torch.Generator().manual_seed(args.seed)).to(torch.bfloat16)
    model, expected = build(args, rank, world, x0)
    shard_mb = sum(w.numel() * w.element_size() for pair in model.shards for w in pair) / 2**20
    _common.banner("tp_inference", args, threads,
                          f"{args.layers} layers, hidden {args.hidden}, ffn {args.ffn}, batch {args.batch}, "
                          f"bf16 weights {shard_mb:.0f} MiB/rank")

    tolerance = REL_TOLERANCE_PER_SQRT_LAYER * math.sqrt(args.layers)
    passed, rel_error = check(model, x0, expected, tolerance)
    if rank == 0:
        print(f"  check against the single-rank computation: {'ok' if passed else 'FAILED'} "
              f"(relative error {rel_error:.2e}, tolerance {tolerance:.1e})", flush=True)
    check_result = {"passed": passed, "rel_error": rel_error, "tolerance": tolerance}
    if not passed:
        _common.write_json(args.json, {"example": "tp_inference", "backend": args.backend,
                                              "world_size": world, "check": check_result})
        dist.destroy_process_group()
        sys.exit(EXIT_MISMATCH)

    x = x0
    for _ in range(args.warmup):
        x = model.step(x)
    model.all_reduce_seconds, model.all_reduce_calls = 0.0, 0
    dist.barrier()  # start the timed loop together
    start = time.perf_counter()
    for _ in range(args.tokens):
        x = model.step(x)
    elapsed = time.perf_counter() - start
    elapsed, all_reduce_seconds = _common.mean_over_ranks([elapsed, model.all_reduce_seconds])

    results = {
        "example": "tp_inference", "backend": args.backend, "world_size": world, "threads": threads,
        "args": vars(args), "check": check_result,
        "tokens_per_s": args.batch * args.tokens / elapsed,
        "step_ms": elapsed / args.tokens * 1e3,
        "all_reduce_us": all_reduce_seconds / model.all_reduce_calls * 1e6,
        "all_reduce_share": all_reduce_seconds / elapsed,
        # A fingerprint of the decoded states: equal on both backends when their sums round alike.
        "final_state_sum": x.float().sum().item(),
    }
    if rank == 0:
        print(f"tp_inference {args.backend:>4} world={world}: {results['tokens_per_s']:.1f} tokens/s "
              f"({results['step_ms']:.2f} ms/step), all_reduce {results['all_reduce_us']:.1f} us/layer, "
              f"{100 * results['all_reduce_share']:.1f}% of decode time, check ok", flush=True)
    _common.write_json(args.json, results)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
