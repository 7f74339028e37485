"""The memory lent to results the caller keeps (shmcoll._pool, through sparse.Buffers.result): a block
comes back only when torch has freed every tensor on it, from any thread; a held block is never lent
twice; the pool keeps no more than its limit; a block outlives its pool while a tensor holds it."""
from __future__ import annotations

import gc
import threading

import torch

from shmcoll import _pool
from shmcoll.sparse import Buffers
from tests.ext_source import constant


MAX_BLOCKS = constant("pool.pyx", "MAX_BLOCKS")  # the most blocks a pool lends at once


def _lend(pool, nbytes):
    return torch.from_dlpack(pool.lend(nbytes))


def test_a_block_comes_back_when_the_last_view_is_freed():
    pool = _pool.Pool(10_000)
    block = _lend(pool, 1000)  # 1250 kept (a quarter's room to grow)
    address = block.data_ptr()
    assert block.shape == (1000,) and block.dtype == torch.uint8 and address % 64 == 0
    values = block[64:].view(torch.float32)
    del block
    again = _lend(pool, 1000)
    assert again.data_ptr() != address  # the view still holds the first block
    del values
    small = _lend(pool, 100)
    assert small.data_ptr() == address  # the freed block, the smallest that holds 100
    # ... kept, not dropped for a new one that malloc placed there: 1250 + 1250 + 7625 would pass the limit.
    assert pool.lend(6100) is None


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
    pool = _pool.Pool(10_000)
    box = [_lend(pool, 512)]  # 640 kept
    address = box[0].data_ptr()
    thread = threading.Thread(target=box.clear)
    thread.start()
    thread.join()
    small = _lend(pool, 100)
    assert small.data_ptr() == address
    assert pool.lend(7500) is None  # 640 + 9375 would pass the limit: the block is the pool's, not a new one


def test_the_limit_bounds_what_is_kept_and_the_caller_falls_back():
    pool = _pool.Pool(10_000)
    first = _lend(pool, 4400)  # 5500 kept (a quarter's room to grow)
    address = first.data_ptr()
    assert pool.lend(4400) is None  # another 5500 would pass the limit
    assert pool.lend(9000) is None  # larger than the limit with its room
    del first
    again = _lend(pool, 5500)  # the free block, whole
    assert again.data_ptr() == address
    assert pool.lend(3000) is not None  # 5500 + 3750 fits; beside a new block of 6875 it would not
    del again
    grown = _lend(pool, 6000)  # too large for the free block: dropped for one of 7500, which fits beside nothing
    assert grown.numel() == 6000
    assert pool.lend(2100) is None  # 7500 + 2625 would pass the limit
    assert _lend(pool, 1900).numel() == 1900  # 7500 + 2375 fits: the dropped block is not kept
    buffers = Buffers()
    buffers.KEEP_BYTES = 100
    buffers._results = _pool.Pool(buffers.KEEP_BYTES)
    result = buffers.result(1000)  # torch's memory: the pool has no room
    assert result.numel() == 1000
    result.untyped_storage().resize_(2000)  # a pool's block refuses this (the last test)


def test_at_most_max_blocks_are_lent_then_the_caller_falls_back():
    pool = _pool.Pool(1 << 30)
    held = []
    while (capsule := pool.lend(100)) is not None:
        held.append(torch.from_dlpack(capsule))
    assert len(held) == MAX_BLOCKS
    assert len({t.data_ptr() for t in held}) == len(held)


def test_a_capsule_torch_never_took_gives_its_block_back():
    pool = _pool.Pool(1 << 20)
    capsules = [pool.lend(100) for _ in range(MAX_BLOCKS)]
    assert pool.lend(100) is None  # every block lent
    del capsules
    assert all(pool.lend(100) is not None for _ in range(MAX_BLOCKS))  # every block back


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
