"""The memory lent to results the caller keeps (shmcoll._pool, through sparse.Buffers.result): a block
comes back only when torch has freed every tensor on it, from any thread; a held block is never lent
twice; the pool keeps no more than its limit; a block outlives its pool while a tensor holds it."""
from __future__ import annotations

import gc
import threading

import torch

from shmcoll import _pool
from shmcoll.sparse import Buffers


def _lend(pool, nbytes):
    return torch.from_dlpack(pool.lend(nbytes))


def test_a_block_comes_back_when_the_last_view_is_freed():
    pool = _pool.Pool(1 << 20)
    block = _lend(pool, 1000)
    address = block.data_ptr()
    assert block.shape == (1000,) and block.dtype == torch.uint8 and address % 64 == 0
    values = block[64:].view(torch.float32)
    del block
    assert pool.kept()[2] == 1  # the view still holds it
    again = _lend(pool, 1000)
    assert again.data_ptr() != address
    del values
    assert pool.kept()[2] == 1  # only `again` now
    assert _lend(pool, 900).data_ptr() == address  # the freed block, not a new one


def test_a_held_result_keeps_its_data():
    pool = _pool.Pool(1 << 20)
    held = _lend(pool, 4096)
    held.copy_(torch.arange(4096) % 251)
    for _ in range(5):
        other = _lend(pool, 4096)
        other.fill_(7)
        del other
    assert torch.equal(held, (torch.arange(4096) % 251).to(torch.uint8))


def test_a_block_freed_on_another_thread_comes_back():
    pool = _pool.Pool(1 << 20)
    box = [_lend(pool, 512)]
    address = box[0].data_ptr()
    thread = threading.Thread(target=box.clear)
    thread.start()
    thread.join()
    assert pool.kept()[2] == 0
    assert _lend(pool, 512).data_ptr() == address


def test_the_limit_bounds_what_is_kept_and_the_caller_falls_back():
    pool = _pool.Pool(10_000)
    first = _lend(pool, 4400)  # 5500 kept (a quarter's room to grow)
    assert pool.lend(4400) is None  # another 5500 would pass the limit
    assert pool.lend(9000) is None  # larger than the limit with its room
    del first
    assert pool.kept() == (1, 5500, 0)
    grown = _lend(pool, 6000)  # the free block is too small: dropped for a larger one
    assert pool.kept() == (1, 7500, 1) and grown.numel() == 6000
    buffers = Buffers()
    buffers.KEEP_BYTES = 100
    buffers._results = _pool.Pool(buffers.KEEP_BYTES)
    assert buffers.result(1000).numel() == 1000  # torch's memory: the pool has no room
    assert buffers._results.kept() == (0, 0, 0)


def test_at_most_max_blocks_are_lent_then_the_caller_falls_back():
    pool = _pool.Pool(1 << 30)
    held = []
    while (capsule := pool.lend(100)) is not None:
        held.append(torch.from_dlpack(capsule))
    assert len(held) == pool.kept()[0] == pool.kept()[2] >= 2
    assert len({t.data_ptr() for t in held}) == len(held)


def test_a_capsule_torch_never_took_gives_its_block_back():
    pool = _pool.Pool(1 << 20)
    capsule = pool.lend(100)
    assert pool.kept()[2] == 1
    del capsule
    assert pool.kept() == (1, 125, 0)


def test_a_block_outlives_its_pool_while_a_tensor_holds_it():
    pool = _pool.Pool(1 << 20)
    held = _lend(pool, 2048)
    held.fill_(3)
    free_one = _lend(pool, 100)
    del free_one
    del pool
    gc.collect()
    held += 1  # still the tensor's memory (the deleter frees it, not the pool's end)
    assert torch.equal(held, torch.full((2048,), 4, dtype=torch.uint8))
    del held


def test_the_tensor_refuses_only_a_resize_of_its_storage():
    block = _lend(_pool.Pool(1 << 20), 256)
    values = block.view(torch.float64)
    values.fill_(1.0).add_(1.5)  # (not mul_(0) of the block as lent: a NaN in it stays NaN)
    assert values.sum().item() == 80.0
    try:
        block.untyped_storage().resize_(512)
    except RuntimeError as error:
        assert "not resizable" in str(error)
    else:
        raise AssertionError("the lent storage was resized")
