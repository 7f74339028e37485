"""The buffers a group's sparse all_reduces reuse (shmcoll.sparse.Buffers): reuse, growth that keeps
the rows a call still needs, and no memory pinned above the limit."""
from __future__ import annotations

import torch

from shmcoll.sparse import Buffers


def test_a_call_of_the_same_size_reuses_the_memory():
    buffers = Buffers()
    first = buffers.rows("values", 100, (8,), torch.float32)
    again = buffers.rows("values", 90, (8,), torch.float32)
    assert again.data_ptr() == first.data_ptr() and again.shape == (90, 8)


def test_growing_keeps_the_rows_asked_for():
    buffers = Buffers()
    part = buffers.rows("values", 10, (3,), torch.float64)
    part.copy_(torch.arange(30, dtype=torch.float64).view(10, 3))
    padded = buffers.rows("values", 1000, (3,), torch.float64, keep=7)
    assert padded.shape == (1000, 3) and padded.data_ptr() != part.data_ptr()
    assert torch.equal(padded[:7], torch.arange(21, dtype=torch.float64).view(7, 3))


def test_views_of_every_dtype_and_empty_rows():
    buffers = Buffers()
    for dtype in (torch.bfloat16, torch.int64, torch.uint8, torch.float16):
        assert buffers.rows("x", 5, (2, 3), dtype).shape == (5, 2, 3)
    assert buffers.rows("x", 7, (0,), torch.float32).shape == (7, 0)
    assert buffers.rows("x", 0, (4,), torch.float32).shape == (0, 4)


def test_a_buffer_above_the_limit_lives_only_for_its_call():
    buffers = Buffers()
    buffers.KEEP_BYTES = 1000
    small = buffers.rows("indices", 10, (1,), torch.int64)  # 80 bytes: kept
    big = buffers.rows("values", 100, (4,), torch.float32)  # 1600 bytes: this call only
    big[:5] = 1.5
    # Within the call, the big buffer still serves the rows the call keeps.
    grown = buffers.rows("values", 200, (4,), torch.float32, keep=5)
    assert torch.equal(grown[:5], torch.full((5, 4), 1.5))
    buffers.trim()
    assert buffers.rows("indices", 10, (1,), torch.int64).data_ptr() == small.data_ptr()
    assert buffers.rows("values", 100, (4,), torch.float32).data_ptr() not in (big.data_ptr(), grown.data_ptr())
