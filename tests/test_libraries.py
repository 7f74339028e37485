"""shm as a drop-in for Gloo, through what PyTorch and its users build on a process group.

Each scenario (tests/library_scenarios.py) runs with shm as the default group
and a Gloo group beside it as the reference.
"""
import json
import subprocess

import pytest

from tests.harness import REPO, assert_job_passes, rank_environment, shm_entries, spawn, torchrun_command

# 4 KiB chunks: the larger sizes of the scenarios take the multi-chunk paths.
SMALL_CHUNKS = {"SHMCOLL_CHUNK_BYTES": "4096", "SHMCOLL_SMALL_BYTES": "1024"}

# The compatibility tier (TESTING.md, "Every torch") takes the scenarios that run at 2 and 3 ranks at 3.
THREE = pytest.param(3, marks=pytest.mark.compat)


@pytest.mark.parametrize("world_size", [2, THREE])
def test_list_shaped_apis_match_gloo(world_size):
    result = spawn("tests.library_scenarios:layouts", world_size, env=SMALL_CHUNKS)
    assert_job_passes(result, min_cases=37)


def test_integer_average_truncates_like_nccl():
    assert_job_passes(spawn("tests.library_scenarios:integer_average", 3, env=SMALL_CHUNKS), min_cases=9)


@pytest.mark.parametrize("world_size", [2, THREE])
def test_direct_process_group_calls_match_gloo(world_size):
    assert_job_passes(spawn("tests.library_scenarios:direct_calls", world_size), min_cases=2)


def test_timeout_says_timed_out():
    assert_job_passes(spawn("tests.library_scenarios:timeout_wording", 2, timeout=120), min_cases=1)


@pytest.mark.parametrize("world_size", [2, 3])
def test_sparse_all_reduce_matches_gloo(world_size):
    before = shm_entries()
    assert_job_passes(spawn("tests.library_scenarios:sparse", world_size, env=SMALL_CHUNKS), min_cases=14)
    assert shm_entries() - before == set()


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_over_sparse_embeddings_matches_gloo(world_size):
    assert_job_passes(spawn("tests.library_scenarios:sparse_ddp", world_size), min_cases=2)


@pytest.mark.compat
@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_powersgd_matches_gloo(world_size):
    assert_job_passes(spawn("tests.library_scenarios:powersgd_ddp", world_size, timeout=120), min_cases=1)


def test_torch_compile():
    """Compiled functions calling eager collectives (aot_eager, inductor), and torch.compile(DDP(model))."""
    assert_job_passes(spawn("tests.library_scenarios:compiled", 2, timeout=600), min_cases=3)


@pytest.mark.compat
def test_fsdp2_state_dicts():
    """FSDP2 full state dicts loaded with broadcast_from_rank0 (model and optimizer)."""
    assert_job_passes(spawn("tests.library_scenarios:fsdp2_state_dicts", 2, timeout=300), min_cases=1)


@pytest.mark.parametrize("world_size", [2, 3])
def test_pipelining_matches_gloo(world_size):
    """torch.distributed.pipelining (GPipe, 1F1B): the stages' point-to-point messages on shm."""
    assert_job_passes(spawn("tests.library_scenarios:pipelining", world_size, timeout=300), min_cases=2)


@pytest.mark.compat
def test_distributed_checkpoint(tmp_path):
    """torch.distributed.checkpoint: save and async_save, then load into a fresh model."""
    assert_job_passes(spawn("tests.library_scenarios:checkpoint", 2, args=[str(tmp_path)], timeout=300),
                      min_cases=2)


def _torchrun_job(job: str, backend: str, tmp_path) -> dict:
    out = tmp_path / f"{job}-{backend}.json"
    proc = subprocess.run(torchrun_command(2, "tests.library_jobs", job, backend, str(out)), env=rank_environment(),
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return json.loads(out.read_text())


def test_lightning_sync_dist(tmp_path):
    """Lightning's Trainer with DDPStrategy(process_group_backend="shm") and self.log(sync_dist=True) of
    int64 and float tensors (AVG on integers): the logged values equal Gloo's run."""
    ours, gloos = _torchrun_job("lightning", "shm", tmp_path), _torchrun_job("lightning", "gloo", tmp_path)
    assert ours.keys() == gloos.keys() == {"loss", "count", "negative"}, (ours, gloos)
    assert ours == gloos, (ours, gloos)


def test_huggingface_trainer(tmp_path):
    """transformers.Trainer after init_process_group("shm"): the same losses as after init_process_group("gloo")."""
    ours, gloos = _torchrun_job("huggingface", "shm", tmp_path), _torchrun_job("huggingface", "gloo", tmp_path)
    assert ours["world"] == 2 and len(ours["losses"]) == 4, ours
    assert ours == gloos, (ours, gloos)
