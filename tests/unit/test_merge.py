"""The k-way merge of the sparse all_reduce (shmcoll._merge) on its own: the parts' sum in rank order,
against torch's sparse additions done one by one, no write past the rows it was given, and steps that do not
fit the parts refused."""
from __future__ import annotations

import math

import pytest
import torch

from shmcoll import _merge, kernel_abi, kernel_library


def _parts(world: int, shape, nnz, sparse_dim: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    parts = []
    for r in range(world):
        indices = torch.stack([torch.randint(0, shape[d], (nnz[r],), generator=g) for d in range(sparse_dim)])
        values = torch.randn((nnz[r], *shape[sparse_dim:]), generator=g) * 10 ** r  # sums that round
        parts.append(torch.sparse_coo_tensor(indices, values, shape, check_invariants=True).coalesce())
    return parts


def _added_in_rank_order(parts):
    """Gloo's additions: one rounding each, in rank order."""
    expected = parts[0]
    for part in parts[1:]:
        expected = (expected + part).coalesce()
    return expected


def _plan(indices, counts, size, most, dims, steps):
    """``_merge.plan`` of these tensors, with its scratch, whose bounds it must keep (a guard after them)."""
    room = 2 * int(counts.sum())
    scratch = torch.full((room + 1,), -99, dtype=torch.int64)
    rows = _merge.plan(indices.data_ptr(), counts.data_ptr(), size, most, dims, steps.data_ptr(), scratch.data_ptr())
    assert scratch[room] == -99, "the plan wrote past its scratch"
    return rows


def _merge_at_hand(steps, total, indices, values, counts, size, most, dims, row_elems, row_bytes, out_indices,
                   out_values, nnz, kernel, sum_op):
    """``_merge.Merge`` with every part's values at hand: one window of all ``most`` rows (no stash)."""
    whole = _merge.Merge(steps, total, indices, counts, size, most, dims, row_elems, row_bytes, out_indices,
                         out_values, nnz, kernel, sum_op, 0)
    whole.window(0, most, [values + r * most * row_bytes for r in range(size)])
    return whole.finish()


def _gathered(parts):
    """The all-gathers' layout: [size, most, dims] indices and [size, most, ...] values, padded."""
    most = max(p._nnz() for p in parts)
    dims = parts[0].sparse_dim()
    indices = torch.full((len(parts), most, dims), -7, dtype=torch.int64)  # padding that must not be read
    values = torch.full((len(parts), most, *parts[0].shape[dims:]), float("nan"))
    for r, p in enumerate(parts):
        indices[r, :p._nnz()] = p._indices().t()
        values[r, :p._nnz()] = p._values()
    return indices, values, torch.tensor([p._nnz() for p in parts])


@pytest.mark.parametrize("world, shape, nnz, sparse_dim", [
    (1, (40, 3), [0], 1), (2, (40, 3), [25, 0], 1), (2, (40, 3), [0, 25], 1), (2, (40, 3), [25, 31], 1),
    (2, (6, 2), [30, 30], 1), (2, (1000, 2), [300, 1], 1), (3, (40, 3), [25, 31, 17], 1),
    (3, (9, 7, 2), [20, 5, 33], 2), (4, (30, 20), [50, 1, 40, 60], 2), (4, (40, 3), [25, 0, 31, 40], 1),
    (16, (70, 2), [5 * r for r in range(16)], 1), (17, (70, 2), [4 + r for r in range(17)], 1),
])
def test_merge_adds_the_parts_in_rank_order(world, shape, nnz, sparse_dim):
    parts = _parts(world, shape, nnz, sparse_dim, seed=world)
    indices, values, counts = _gathered(parts)
    most, row_elems = indices.shape[1], math.prod(shape[sparse_dim:])
    steps = torch.full((int(counts.sum()),), 1 << 30, dtype=torch.int32)
    rows = _plan(indices, counts, world, most, sparse_dim, steps)
    out_indices = torch.empty((sparse_dim, rows), dtype=torch.int64)
    out_values = torch.empty((rows, *shape[sparse_dim:]))
    _merge_at_hand(steps.data_ptr(), steps.numel(), indices.data_ptr(), values.data_ptr(), counts.data_ptr(), world,
                   most, sparse_dim, row_elems, row_elems * 4, out_indices.data_ptr(), out_values.data_ptr(), rows,
                   kernel_library.entry_point("float32"), kernel_abi.SUM)
    expected = _added_in_rank_order(parts)
    assert torch.equal(out_indices, expected._indices())
    assert torch.equal(out_values, expected._values())


def test_merge_stops_at_the_rows_it_was_given():
    parts = _parts(2, (40, 3), [25, 30], 1, seed=5)
    indices, values, counts = _gathered(parts)
    steps = torch.empty((int(counts.sum()),), dtype=torch.int32)
    rows = _plan(indices, counts, 2, indices.shape[1], 1, steps)
    out_indices = torch.zeros((1, rows), dtype=torch.int64)
    out_values = torch.zeros((rows, 3))
    with pytest.raises(ValueError, match="do not make the"):
        _merge_at_hand(steps.data_ptr(), steps.numel(), indices.data_ptr(), values.data_ptr(), counts.data_ptr(), 2,
                       indices.shape[1], 1, 3, 12, out_indices.data_ptr(), out_values.data_ptr(), rows - 1,
                       kernel_library.entry_point("float32"), kernel_abi.SUM)
    assert torch.equal(out_indices[0, -1], torch.tensor(0)) and not out_values[-1].any()  # nothing past rows-1


@pytest.mark.parametrize("nnz", [[25, 31], [0, 9], [9, 0], [40, 40], [1, 1]])
def test_two_parts_are_planned_as_any_number_is(nnz):
    """Two parts of one sparse dimension take their own branch-free plan: the same steps as the general
    plan makes for the same indices given a second, constant, dimension."""
    parts = _parts(2, (40, 3), nnz, 1, seed=sum(nnz))
    indices, _, counts = _gathered(parts)
    two = torch.full((int(counts.sum()),), 1 << 30, dtype=torch.int32)
    rows = _plan(indices, counts, 2, indices.shape[1], 1, two)
    widened = torch.cat([indices, torch.zeros_like(indices)], dim=2).contiguous()  # (row, 0): the same order
    general = torch.full_like(two, 1 << 30)
    assert _plan(widened, counts, 2, indices.shape[1], 2, general) == rows
    assert torch.equal(two, general)
    assert rows == len(set(torch.cat([p._indices()[0] for p in parts]).tolist()))


@pytest.mark.parametrize("rows", [40, 1 << 62])  # the second: indices too large to pack with a rank
@pytest.mark.parametrize("nnz", [[25, 31, 17], [0, 9, 0], [40, 40, 40, 40], [1, 0, 1, 0], [0, 0, 0],
                                 [7 + 3 * r for r in range(16)], [30] * 5 + [0] + [2] * 10,
                                 [3 + r % 5 for r in range(17)], [4, 0, 9, 2, 6]])
def test_more_parts_are_planned_as_any_number_is(nnz, rows):
    """Three parts or more of one sparse dimension take their own branch-free plan (rows packed with their
    rank, merged as a tree: an odd number of runs at some level for 3, 5, 17 parts): the same steps as the
    general plan makes for the same indices given a second, constant, dimension, and nothing written past
    the steps."""
    world = len(nnz)
    parts = _parts(world, (rows,), nnz, 1, seed=sum(nnz) + world)
    indices, _, counts = _gathered(parts)
    total = int(counts.sum())
    few = torch.full((total + 1,), 1 << 30, dtype=torch.int32)
    sum_rows = _plan(indices, counts, world, indices.shape[1], 1, few)
    widened = torch.cat([indices, torch.zeros_like(indices)], dim=2).contiguous()  # (row, 0): the same order
    general = torch.full_like(few, 1 << 30)
    assert _plan(widened, counts, world, indices.shape[1], 2, general) == sum_rows
    assert torch.equal(few, general) and few[total] == 1 << 30
    assert sum_rows == len(set(torch.cat([p._indices()[0] for p in parts]).tolist()))


@pytest.mark.parametrize("world, nnz, window, skewed", [
    (2, [25, 31], 4, False), (2, [25, 31], 1, False), (2, [25, 31], 7, True), (2, [0, 20], 3, False),
    (3, [25, 31, 17], 5, False), (3, [25, 31, 17], 2, True), (4, [40, 40, 40, 40], 40, False),
    (4, [9, 1, 30, 0], 6, True),
])
def test_windows_give_the_sum_of_every_row_at_hand(world, nnz, window, skewed):
    """Value rows that arrive a window at a time, each window in memory that is gone once the merge has
    seen it (as a slot of the all-gather is): the same sum as with every row at hand. Skewed: part r's
    indices all above part r-1's, so the steps take every row of part 0 before any of part 1, and nearly
    every row waits in the stash."""
    parts = _parts(world, (40, 3), nnz, 1, seed=sum(nnz) + window)
    if skewed:
        parts = [torch.sparse_coo_tensor(p._indices() + 40 * r, p._values(), (40 * world, 3),
                                         check_invariants=True).coalesce()
                 for r, p in enumerate(parts)]
    indices, values, counts = _gathered(parts)
    most = indices.shape[1]
    steps = torch.empty((int(counts.sum()),), dtype=torch.int32)
    rows = _plan(indices, counts, world, most, 1, steps)
    kernel = kernel_library.entry_point("float32")
    whole = (torch.empty((1, rows), dtype=torch.int64), torch.empty((rows, 3)))
    _merge_at_hand(steps.data_ptr(), steps.numel(), indices.data_ptr(), values.data_ptr(), counts.data_ptr(), world,
                   most, 1, 3, 12, whole[0].data_ptr(), whole[1].data_ptr(), rows, kernel, kernel_abi.SUM)
    windowed = (torch.empty((1, rows), dtype=torch.int64), torch.empty((rows, 3)))
    stash = torch.full_like(values, float("nan"))
    merge = _merge.Merge(steps.data_ptr(), steps.numel(), indices.data_ptr(), counts.data_ptr(), world, most, 1, 3,
                         12, windowed[0].data_ptr(), windowed[1].data_ptr(), rows, kernel, kernel_abi.SUM,
                         stash.data_ptr())
    for first in range(0, most, window):
        end = min(first + window, most)
        arrived = [values[r, first:end].clone() for r in range(world)]
        merge.window(first, end, [a.data_ptr() for a in arrived])
        for a in arrived:
            a.fill_(float("nan"))  # the slot is reused: nothing may be read from it later
    assert merge.finish() == rows
    assert torch.equal(windowed[0], whole[0]) and torch.equal(windowed[1], whole[1])
    assert torch.equal(whole[1], _added_in_rank_order(parts)._values())


def test_a_merge_missing_windows_is_refused():
    parts = _parts(2, (40, 3), [25, 30], 1, seed=8)
    indices, values, counts = _gathered(parts)
    steps = torch.empty((int(counts.sum()),), dtype=torch.int32)
    rows = _plan(indices, counts, 2, indices.shape[1], 1, steps)
    out = (torch.empty((1, rows), dtype=torch.int64), torch.empty((rows, 3)))
    merge = _merge.Merge(steps.data_ptr(), steps.numel(), indices.data_ptr(), counts.data_ptr(), 2,
                         indices.shape[1], 1, 3, 12, out[0].data_ptr(), out[1].data_ptr(), rows,
                         kernel_library.entry_point("float32"), kernel_abi.SUM, torch.empty_like(values).data_ptr())
    merge.window(0, 10, [values[r, :10].data_ptr() for r in range(2)])
    with pytest.raises(ValueError, match="do not make the"):
        merge.finish()


@pytest.mark.parametrize("bad", ["rank", "overrun", "add_first"])
def test_merge_refuses_steps_that_do_not_fit_the_parts(bad):
    parts = _parts(2, (40, 3), [25, 30], 1, seed=6)
    indices, values, counts = _gathered(parts)
    steps = torch.empty((int(counts.sum()),), dtype=torch.int32)
    rows = _plan(indices, counts, 2, indices.shape[1], 1, steps)
    if bad == "rank":
        steps[3] = 2  # no rank 2
    elif bad == "overrun":
        steps[:] = 0  # more rows of rank 0 than it has
    else:
        steps[0] = -1 - int(steps[0])  # an addition before any row
    out_indices = torch.zeros((1, rows), dtype=torch.int64)
    out_values = torch.zeros((rows, 3))
    with pytest.raises(ValueError, match="do not make the"):
        _merge_at_hand(steps.data_ptr(), steps.numel(), indices.data_ptr(), values.data_ptr(), counts.data_ptr(), 2,
                       indices.shape[1], 1, 3, 12, out_indices.data_ptr(), out_values.data_ptr(), rows,
                       kernel_library.entry_point("float32"), kernel_abi.SUM)
