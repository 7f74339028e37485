"""bench/peer_deepspeed.py stays optional: without DeepSpeed, or with ranks on several nodes, it says so in
one line and exits 0 before it sets anything up (the job itself: tests/test_peer_deepspeed.py)."""
import importlib.util

import pytest

from tests.harness import REPO


def _module():
    spec = importlib.util.spec_from_file_location("peer_deepspeed", REPO / "bench" / "peer_deepspeed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def rank_env(monkeypatch):
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
                        "LOCAL_WORLD_SIZE": "2", "DS_ACCELERATOR": "cpu"}.items():
        monkeypatch.setenv(name, value)
    # Unset, as under torchrun; set first so that monkeypatch also undoes the value main() gives it.
    monkeypatch.setenv("LOCAL_SIZE", "0")
    monkeypatch.delenv("LOCAL_SIZE")
    return monkeypatch


def _find_spec(deepspeed_installed: bool):
    real = importlib.util.find_spec
    return lambda name, *a: (object() if deepspeed_installed else None) if name == "deepspeed" else real(name, *a)


def test_without_deepspeed_it_says_so_and_exits_0(rank_env, capsys):
    module = _module()
    rank_env.setattr(module.importlib.util, "find_spec", _find_spec(False))
    assert module.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "DeepSpeed is not installed" in out, out


def test_ranks_on_several_nodes_are_refused_in_one_line(rank_env, capsys):
    module = _module()
    rank_env.setattr(module.importlib.util, "find_spec", _find_spec(True))
    rank_env.setenv("LOCAL_WORLD_SIZE", "1")  # LOCAL_SIZE is taken from it: 1 of 2 ranks on this node
    assert module.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "LOCAL_SIZE 1, WORLD_SIZE 2" in out, out
