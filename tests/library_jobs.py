"""Training jobs through Lightning and Hugging Face, as their users write them: ``torchrun -m tests.library_jobs
lightning|huggingface BACKEND OUT_JSON``. Rank 0 writes what the job logged, so that tests/test_libraries.py
compares shm's run with Gloo's.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist


def lightning(backend: str) -> dict:
    """A tiny LightningModule on 2 CPU processes, logging with sync_dist=True: Lightning reduces int64
    metrics with ReduceOp.AVG for every backend not named "gloo", as NCCL accepts."""
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = (self.layer(x) - y).pow(2).mean()
            rank = self.global_rank
            self.log("loss", loss, sync_dist=True)
            self.log("count", torch.tensor(7 + 10 * rank + batch_idx, dtype=torch.int64), sync_dist=True)
            self.log("negative", torch.tensor(-3 - 2 * rank, dtype=torch.int64), sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend=backend),
                        max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
    return {name: value.item() for name, value in trainer.callback_metrics.items()}


def huggingface(backend: str) -> dict:
    """transformers.Trainer on a tiny GPT-2 made from a config (no download), after init_process_group:
    accelerate does not know the name "shm", and takes the group already made."""
    dist.init_process_group(backend)
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=97, n_positions=16))

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            ids = (torch.arange(16) * (i + 3)) % 97
            return {"input_ids": ids, "labels": ids}

    losses = []
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=4, per_device_train_batch_size=4, logging_steps=1,
                                 report_to=[], use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=Tokens())
        trainer.train()
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {"losses": losses, "world": dist.get_world_size()}


if __name__ == "__main__":
    job, backend, out = sys.argv[1:]
    torch.set_num_threads(1)
    result = {"lightning": lightning, "huggingface": huggingface}[job](backend)
    if int(os.environ["RANK"]) == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    if dist.is_initialized():
        dist.destroy_process_group()
