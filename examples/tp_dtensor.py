#!/usr/bin/env python3
"""Tensor-parallel bfloat16 decoding with torch's own tensor parallelism (DTensor): tp_inference.py's model,
parallelised by ``parallelize_module`` instead of by hand.

    torchrun --nproc_per_node=2 examples/tp_dtensor.py --backend shm
    torchrun --nproc_per_node=2 examples/tp_dtensor.py --backend gloo

The same --layers MLP blocks as examples/tp_inference.py (same weights from the same seed), each an
``nn.Module`` whose up projection is ``ColwiseParallel`` and down projection ``RowwiseParallel`` on a
1-D DeviceMesh of all ranks: DTensor shards the weights and, after the down projection, turns each
rank's partial sum into the replicated hidden state with a functional all_reduce (one per layer, issued
through torch.distributed._functional_collectives, as compiled and DTensor code issues them). That is
the path of tensor-parallel serving built on torch (pytorch issue 147596).

The first decode step is checked against the single-rank computation (tp_inference.py's check and
tolerance); rank 0 then prints tokens/s (--batch sequences, one token per step).
"""
from __future__ import annotations

import math
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import _common
import tp_inference
from shmcoll import gloo_exit


class Block(torch.nn.Module):
    """One layer: x + down(gelu(up(rms_norm(x)))), tp_inference.mlp_block as a module."""

    def __init__(self, w_up: torch.Tensor, w_down: torch.Tensor):
        super().__init__()
        self.up = torch.nn.Linear(w_up.shape[1], w_up.shape[0], bias=False, dtype=w_up.dtype)
        self.down = torch.nn.Linear(w_down.shape[1], w_down.shape[0], bias=False, dtype=w_down.dtype)
        with torch.no_grad():
            self.up.weight.copy_(w_up)
            self.down.weight.copy_(w_down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(F.rms_norm(x, (x.shape[-1],)))))


def main() -> None:
    args = tp_inference.decode_arguments(__doc__)

    dist.init_process_group(backend=args.backend)
    # A Gloo job whose functional collectives end with the process can abort at exit (torch issue #190489,
    # Gloo's: shmcoll/gloo_exit.py); an shm group installs this guard itself, the Gloo reference run needs it too.
    gloo_exit.install()
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = _common.set_threads(args.threads)
    mesh = init_device_mesh("cpu", (world,))

    x0 = torch.randn(args.batch, args.hidden, generator=torch.Generator().manual_seed(args.seed)).to(torch.bfloat16)
    blocks, reference = [], x0
    for layer in range(args.layers):
        w_up, w_down = tp_inference.layer_weights(args.seed, layer, args.hidden, args.ffn)
        reference = reference + tp_inference.mlp_block(reference, w_up, w_down)
        block = parallelize_module(Block(w_up, w_down), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        blocks.append(block)
    expected = F.rms_norm(reference, (args.hidden,))
    _common.banner("tp_dtensor", args, threads, f"{args.layers} layers, hidden {args.hidden}, ffn {args.ffn}, "
                                                f"batch {args.batch}, parallelize_module on a {world}-rank mesh")

    @torch.no_grad()
    def step(x: torch.Tensor) -> torch.Tensor:
        for block in blocks:
            x = block(x)
        return F.rms_norm(x, (x.shape[-1],))

    tolerance = tp_inference.REL_TOLERANCE_PER_SQRT_LAYER * math.sqrt(args.layers)
    got = step(x0).float()
    worst = torch.tensor([((got - expected.float()).norm() / expected.float().norm()).item()], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    rel_error = worst.item()
    passed = bool(rel_error <= tolerance)  # NaN fails too
    if rank == 0:
        print(f"  check against the single-rank computation: {'ok' if passed else 'FAILED'} "
              f"(relative error {rel_error:.2e}, tolerance {tolerance:.1e})", flush=True)
    check_result = {"passed": passed, "rel_error": rel_error, "tolerance": tolerance}
    if not passed:
        _common.write_json(args.json, {"example": "tp_dtensor", "backend": args.backend, "world_size": world,
                                       "check": check_result})
        dist.destroy_process_group()
        sys.exit(tp_inference.EXIT_MISMATCH)

    x = x0
    for _ in range(args.warmup):
        x = step(x)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.tokens):
        x = step(x)
    elapsed, = _common.mean_over_ranks([time.perf_counter() - start])
    results = {"example": "tp_dtensor", "backend": args.backend, "world_size": world, "threads": threads,
               "args": vars(args), "check": check_result, "tokens_per_s": args.batch * args.tokens / elapsed,
               "step_ms": elapsed / args.tokens * 1e3, "final_state_sum": x.float().sum().item()}
    if rank == 0:
        print(f"tp_dtensor {args.backend:>4} world={world}: {results['tokens_per_s']:.1f} tokens/s "
              f"({results['step_ms']:.2f} ms/step), check ok", flush=True)
    _common.write_json(args.json, results)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
