"""Training and checkpointing workloads run inside spawned ranks (see tests/worker.py).

Issue "DDP, FSDP, ZeRO and checkpointing unchanged": the same workloads run
under ``shm`` and under ``gloo`` (tests/test_workloads.py compares them).

``all_workloads(cases, names)`` runs the named workloads (comma separated, or
"all") one after the other in this job and returns
``{"workloads": {name: {"losses": [...], "params": [...], ...}}}``; every
workload is also recorded as the case ``name`` (it ran without error) and,
where there is a single-process reference, as ``name/vs_reference``.

Each workload runs on a fresh process group of the default group's backend
(``dist.new_group``) with a short timeout, so a workload that fails half-way
on one backend leaves the next workloads a clean group, and a hang costs at
most ``GROUP_TIMEOUT``. FSDP2 is the exception: it uses
``init_device_mesh("cpu", (world,))``, which for a 1-D mesh over the whole
world reuses the default group, as users would call it.

Every rank draws the same global batch from a seed per step and trains on its
slice, so the results do not depend on the backend and a single-process
reference (the mean of the per-rank losses, i.e. DDP's gradient average) can
be computed locally in every rank.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

GROUP_TIMEOUT = timedelta(seconds=60)
GLOBAL_BATCH = 12  # divisible by world sizes 1, 2, 3, 4
IN, HIDDEN, OUT = 8, 16, 4
STEPS = 5

# Tolerance against the single-process reference (float32 everywhere). DDP
# divides each rank's gradient by the world size and sums them in the
# backend's order; the reference sums the per-rank losses first. The results
# differ by a few float32 ulps per step (relative 1e-7 .. 1e-6); 5 steps of
# SGD/Adam on a well-conditioned tiny MLP do not amplify that past 1e-5.
REF_TOL = dict(rtol=1e-5, atol=1e-6)
# fp16/bf16 compression hooks round each gradient bucket to 16 bits before the
# all-reduce (and divide by the world size in 16 bits), so the reference,
# which keeps float32 gradients, is only close to half/bfloat16 precision:
# a relative gradient error of ~2^-11 (fp16) / 2^-8 (bf16) per step, summed
# into the parameters with weight ~1.3 (lr 0.1, momentum 0.9, 5 steps).
# Measured at 2 and 3 ranks: at most 9e-5 (fp16) and 4e-4 (bf16) absolute on
# parameters of size <= 0.4, about a third of these tolerances or less.
HOOK_REF_TOL = {"fp16": dict(rtol=2e-3, atol=2e-4), "bf16": dict(rtol=2e-2, atol=2e-3)}


# -- data, models, references -------------------------------------------------

def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, IN, generator=g)
    w = torch.linspace(-1, 1, IN * OUT).reshape(IN, OUT)
    y = torch.sin(x @ w) + 0.1 * torch.randn(GLOBAL_BATCH, OUT, generator=g)
    return x, y


def rank_batch(step: int, rank: int, world: int):
    x, y = global_batch(step)
    per = GLOBAL_BATCH // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, OUT))


class Branchy(nn.Module):
    """A trunk and a head, plus a branch used only in some steps on some ranks."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.trunk = nn.Linear(IN, HIDDEN)
        self.head = nn.Linear(HIDDEN, OUT)
        self.branch = nn.Linear(HIDDEN, OUT)

    def forward(self, x, use_branch: bool):
        h = torch.tanh(self.trunk(x))
        out = self.head(h)
        if use_branch:
            out = out + self.branch(h)
        return out


def branch_used(step: int, rank: int) -> bool:
    """Step 0, 4: every rank; 2: rank 0 only (locally unused elsewhere); odd steps: no rank."""
    return step % 2 == 0 and (rank == 0 or step % 4 == 0)


loss_fn = nn.MSELoss()


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def reference(model: nn.Module, opt: torch.optim.Optimizer, steps: int, world: int, micro: int = 1,
              forward=None) -> tuple[list[list[float]], torch.Tensor]:
    """Single process, DDP semantics: gradient = mean over ranks of each rank's gradient.

    Returns the per-rank losses of every step ([step][rank], first micro-batch
    is step*micro) and the final parameters.
    """
    forward = forward or (lambda m, x, step, rank: m(x))
    losses = []
    for step in range(steps):
        opt.zero_grad()
        per_rank = [0.0] * world
        total = 0.0
        for m in range(micro):
            for rank in range(world):
                x, y = rank_batch(step * micro + m, rank, world)
                loss = loss_fn(forward(model, x, step, rank), y)
                total = total + loss / world
                if m == micro - 1:
                    per_rank[rank] = loss.item()
        total.backward()
        opt.step()
        losses.append(per_rank)
    return losses, flat_params(model)


def _close(actual, expected, what, **tol):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64),
                               torch.as_tensor(expected, dtype=torch.float64), msg=lambda m: f"{what}: {m}",
                               **tol)


def _new_group():
    return dist.new_group(timeout=GROUP_TIMEOUT)


# -- workloads -------------------------------------------------------------------
# Each takes (cases, out) and fills out[name] with what the parent compares.

def _ddp_train(ddp, opt, steps, rank, world, micro=1, forward=None):
    forward = forward or (lambda m, x, step: m(x))
    losses = []
    for step in range(steps):
        opt.zero_grad()
        for m in range(micro):
            x, y = rank_batch(step * micro + m, rank, world)
            if m < micro - 1:
                with ddp.no_sync():
                    loss_fn(forward(ddp, x, step), y).backward()
            else:
                loss = loss_fn(forward(ddp, x, step), y)
                loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _ddp_workload(cases, out, name, *, make_model=mlp, opt_fn=None, micro=1, forward=None, ref_forward=None,
                  hook=None, ddp_kwargs=None, ref_tol=REF_TOL, steps=STEPS):
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    opt_fn = opt_fn or (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9))
    state = {}

    def run():
        group = _new_group()
        model = make_model()
        ddp = DDP(model, process_group=group, **(ddp_kwargs or {}))
        if hook is not None:
            ddp.register_comm_hook(group, hook)
        opt = opt_fn(ddp.parameters())
        losses = _ddp_train(ddp, opt, steps, rank, world, micro, forward)
        state["losses"], state["params"] = losses, flat_params(model)
        out[name] = {"losses": losses, "params": state["params"].tolist()}

    cases.run(name, run)
    if "params" not in state:
        return

    def vs_reference():
        model = make_model()
        ref_losses, ref_params = reference(model, opt_fn(model.parameters()), steps, world, micro, ref_forward)
        _close(state["losses"], [row[rank] for row in ref_losses], "losses", **ref_tol)
        _close(state["params"], ref_params, "final parameters", **ref_tol)

    cases.run(f"{name}/vs_reference", vs_reference)


def ddp_default(cases, out):
    _ddp_workload(cases, out, "ddp_default")


def ddp_no_sync(cases, out):
    _ddp_workload(cases, out, "ddp_no_sync", micro=3)


def ddp_find_unused(cases, out):
    rank = dist.get_rank()
    _ddp_workload(cases, out, "ddp_find_unused", make_model=Branchy, steps=6,
                  opt_fn=lambda params: torch.optim.SGD(params, lr=0.1),
                  forward=lambda m, x, step: m(x, branch_used(step, rank)),
                  ref_forward=lambda m, x, step, r: m(x, branch_used(step, r)),
                  ddp_kwargs={"find_unused_parameters": True})


def ddp_fp16_hook(cases, out):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    _ddp_workload(cases, out, "ddp_fp16_hook", hook=default_hooks.fp16_compress_hook,
                  ref_tol=HOOK_REF_TOL["fp16"])


def cpu_bf16_compress_hook(process_group, bucket):
    """``default_hooks.bf16_compress_hook`` itself, under another name.

    DDP.register_comm_hook refuses a hook *named* bf16_compress_hook unless
    torch was built with CUDA and NCCL >= 2.10 (or XPU and XCCL); on a CPU
    build it raises TypeError before any backend is involved. The hook's code
    (cast to bfloat16, divide, all_reduce async, cast back in a future
    callback) works on CPU with any backend that reduces bfloat16, so it runs
    here unchanged behind a different name (no annotations: DDP's check only
    looks at them when present, and the parameter must be called ``bucket``).
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(process_group, bucket)


def ddp_bf16_hook(cases, out):
    _ddp_workload(cases, out, "ddp_bf16_hook", hook=cpu_bf16_compress_hook, ref_tol=HOOK_REF_TOL["bf16"])


def zero_optimizer(cases, out):
    """DDP + ZeroRedundancyOptimizer(Adam), then consolidate_state_dict onto rank 0."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    state = {}

    def run():
        group = _new_group()
        model = mlp()
        ddp = DDP(model, process_group=group)
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, process_group=group,
                                      lr=0.01)
        losses = _ddp_train(ddp, opt, STEPS, rank, world)
        state["losses"], state["params"] = losses, flat_params(model)
        out["zero_optimizer"] = {"losses": losses, "params": state["params"].tolist()}
        state["group"], state["opt"] = group, opt

    cases.run("zero_optimizer", run)
    if "params" not in state:
        return

    def vs_reference():
        model = mlp()
        ref_losses, ref_params = reference(model, torch.optim.Adam(model.parameters(), lr=0.01), STEPS, world)
        _close(state["losses"], [row[rank] for row in ref_losses], "losses", **REF_TOL)
        _close(state["params"], ref_params, "final parameters", **REF_TOL)

    cases.run("zero_optimizer/vs_reference", vs_reference)

    def consolidate():
        opt = state["opt"]
        opt.consolidate_state_dict(to=0)
        if rank == 0:
            sd = opt.state_dict()
            n_params = len(list(mlp().parameters()))
            assert len(sd["state"]) == n_params, f"{len(sd['state'])} parameter states, expected {n_params}"
            assert all(int(s["step"]) == STEPS for s in sd["state"].values()), "Adam step counts"
            out["zero_optimizer"]["consolidated_exp_avg_sq_sum"] = float(
                sum(s["exp_avg_sq"].double().sum() for s in sd["state"].values()))

    cases.run("zero_optimizer/consolidate_state_dict", consolidate)


def fsdp2(cases, out):
    """FSDP2 fully_shard on CPU over init_device_mesh("cpu", (world,)) (the default group)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    opt_fn = lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)  # noqa: E731
    state = {}

    def run():
        mesh = init_device_mesh("cpu", (world,))
        model = mlp()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = opt_fn(model.parameters())
        losses = []
        for step in range(STEPS):
            opt.zero_grad()
            x, y = rank_batch(step, rank, world)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        params = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])
        state["losses"], state["params"] = losses, params
        assert dist.get_backend(mesh.get_group()) == dist.get_backend(), "the mesh should use the default backend"
        out["fsdp2"] = {"losses": losses, "params": params.tolist()}

    cases.run("fsdp2", run)
    if "params" not in state:
        return

    def vs_reference():
        model = mlp()
        ref_losses, ref_params = reference(model, opt_fn(model.parameters()), STEPS, world)
        _close(state["losses"], [row[rank] for row in ref_losses], "losses", **REF_TOL)
        _close(state["params"], ref_params, "final parameters", **REF_TOL)

    cases.run("fsdp2/vs_reference", vs_reference)


def _rank_object(r: int):
    return {"rank": r, "name": f"rank-{r}", "items": list(range(r + 1)), "nested": {"t": (r, "x" * (3 * r))},
            "big": "y" * (5000 + 17 * r)}


def object_collectives(cases, out):
    rank, world = dist.get_rank(), dist.get_world_size()
    results = out.setdefault("object_collectives", {})

    def all_gather_object():
        got = [None] * world
        dist.all_gather_object(got, _rank_object(rank), group=_new_group())
        assert got == [_rank_object(r) for r in range(world)], got
        results["all_gather_object"] = got

    def broadcast_object_list():
        src = world - 1
        objs = [_rank_object(src), [1, 2.5, "three"], None] if rank == src else [None, None, None]
        dist.broadcast_object_list(objs, src=src, group=_new_group())
        assert objs == [_rank_object(src), [1, 2.5, "three"], None], objs
        results["broadcast_object_list"] = objs

    def gather_object():
        dst = world - 1
        got = [None] * world if rank == dst else None
        dist.gather_object(_rank_object(rank), got, dst=dst, group=_new_group())
        if rank == dst:
            assert got == [_rank_object(r) for r in range(world)], got
        results["gather_object"] = got

    def scatter_object_list():
        inputs = [_rank_object(10 + r) for r in range(world)] if rank == 0 else None
        got = [None]
        dist.scatter_object_list(got, inputs, src=0, group=_new_group())
        assert got[0] == _rank_object(10 + rank), got
        results["scatter_object_list"] = got[0]

    for fn in (all_gather_object, broadcast_object_list, gather_object, scatter_object_list):
        cases.run(f"object_collectives/{fn.__name__}", fn)


def _checkpoint_folder(name: str) -> str:
    """A folder every rank of this job sees: next to the report files (one temporary folder per job)."""
    return os.path.join(os.path.dirname(os.environ["SHMCOLL_TEST_REPORT"]), name)


def _blank_like(state):
    return {key: torch.full_like(t, -3.0) for key, t in state.items()}


def checkpoint(cases, out):
    """dcp.save then dcp.load of a (replicated) model state_dict and a plain object."""
    import torch.distributed.checkpoint as dcp

    def run():
        group = _new_group()
        folder = _checkpoint_folder("dcp-replicated")
        saved = {"model": mlp().state_dict(), "extra": {"step": 7, "tag": "saved", "lr": [0.1, 0.01]}}
        dcp.save(saved, checkpoint_id=folder, process_group=group)
        loaded = {"model": _blank_like(saved["model"]), "extra": {"step": -1, "tag": "blank", "lr": []}}
        dcp.load(loaded, checkpoint_id=folder, process_group=group)
        for key, tensor in saved["model"].items():
            assert torch.equal(loaded["model"][key], tensor), f"model.{key} differs after load"
        assert loaded["extra"] == saved["extra"], loaded["extra"]
        out["checkpoint"] = {"params": torch.cat([t.reshape(-1) for t in loaded["model"].values()]).tolist(),
                             "extra": loaded["extra"]}

    cases.run("checkpoint", run)


def checkpoint_sharded(cases, out):
    """dcp.save then dcp.load of a DTensor sharded over the ranks (one row block each), no resharding."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    rank = dist.get_rank()

    def run():
        group = _new_group()
        mesh = DeviceMesh.from_group(group, "cpu")
        folder = _checkpoint_folder("dcp-sharded")
        local = torch.randn(3, 5, generator=torch.Generator().manual_seed(100 + rank))
        saved = {"weight": DTensor.from_local(local, mesh, [Shard(0)], run_check=False), "bias": torch.arange(5.0)}
        dcp.save(saved, checkpoint_id=folder, process_group=group)
        loaded = {"weight": DTensor.from_local(torch.zeros(3, 5), mesh, [Shard(0)], run_check=False),
                  "bias": torch.zeros(5)}
        dcp.load(loaded, checkpoint_id=folder, process_group=group)
        assert torch.equal(loaded["weight"].to_local(), local), "this rank's shard differs after load"
        assert torch.equal(loaded["bias"], saved["bias"]), "replicated tensor differs after load"
        out["checkpoint_sharded"] = {"params": loaded["weight"].to_local().reshape(-1).tolist()}

    cases.run("checkpoint_sharded", run)


WORKLOADS = {
    "ddp_default": ddp_default,
    "ddp_no_sync": ddp_no_sync,
    "ddp_find_unused": ddp_find_unused,
    "ddp_fp16_hook": ddp_fp16_hook,
    "ddp_bf16_hook": ddp_bf16_hook,
    "zero_optimizer": zero_optimizer,
    "object_collectives": object_collectives,
    "checkpoint": checkpoint,
    "checkpoint_sharded": checkpoint_sharded,
    "fsdp2": fsdp2,  # last: it runs on the default group
}


def all_workloads(cases, names: str = "all"):
    torch.set_num_threads(1)
    selected = list(WORKLOADS) if names == "all" else names.split(",")
    out: dict = {}
    for name in selected:
        WORKLOADS[name](cases, out)
    return {"workloads": out, "backend": dist.get_backend()}
