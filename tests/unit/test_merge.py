"""The k-way merge of the sparse all_reduce (shmcoll._merge) on its own: the parts' sum in rank order,
against torch's sparse additions done one by one, and no write past the rows it was given."""
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
    (1, (40, 3), [0], 1), (2, (40, 3), [25, 0], 1), (3, (40, 3), [25, 31, 17], 1),
    (3, (9, 7, 2), [20, 5, 33], 2), (4, (30, 20), [50, 1, 40, 60], 2),
])
def test_merge_adds_the_parts_in_rank_order(world, shape, nnz, sparse_dim):
    parts = _parts(world, shape, nnz, sparse_dim, seed=world)
    indices, values, counts = _gathered(parts)
    most, row_elems = indices.shape[1], math.prod(shape[sparse_dim:])
    rows = _merge.merged_rows(indices.data_ptr(), counts.data_ptr(), world, most, sparse_dim)
    out_indices = torch.empty((sparse_dim, rows), dtype=torch.int64)
    out_values = torch.empty((rows, *shape[sparse_dim:]))
    _merge.merge(indices.data_ptr(), values.data_ptr(), counts.data_ptr(), world, most, sparse_dim, row_elems,
                 row_elems * 4, out_indices.data_ptr(), out_values.data_ptr(), rows,
                 kernel_library.entry_point("float32"), kernel_abi.SUM)
    expected = parts[0]
    for part in parts[1:]:
        expected = (expected + part).coalesce()  # Gloo's additions: one rounding each, in rank order
    assert torch.equal(out_indices, expected._indices())
    assert torch.equal(out_values, expected._values())


def test_merge_stops_at_the_rows_it_was_given():
    parts = _parts(2, (40, 3), [25, 30], 1, seed=5)
    indices, values, counts = _gathered(parts)
    rows = _merge.merged_rows(indices.data_ptr(), counts.data_ptr(), 2, indices.shape[1], 1)
    out_indices = torch.zeros((1, rows), dtype=torch.int64)
    out_values = torch.zeros((rows, 3))
    with pytest.raises(ValueError, match="counted"):
        _merge.merge(indices.data_ptr(), values.data_ptr(), counts.data_ptr(), 2, indices.shape[1], 1, 3, 12,
                     out_indices.data_ptr(), out_values.data_ptr(), rows - 1,
                     kernel_library.entry_point("float32"), kernel_abi.SUM)
    assert torch.equal(out_indices[0, -1], torch.tensor(0)) and not out_values[-1].any()  # nothing past rows-1
