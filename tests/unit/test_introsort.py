"""shmcoll._merge.sort against torch.sort itself: the same sorted keys and the same permutation, equal keys
included (their order decides a coalesce's last bits), on every path of the algorithm: short runs, the
block partition and its last stretch, the final insertion sort, and the heapsort an adversary forces."""
from __future__ import annotations

import pytest
import torch

from shmcoll import _merge, sparse


def _ours(keys: torch.Tensor):
    n = keys.numel()
    pairs = torch.full((n, 2), -1, dtype=torch.int64)
    sorted_keys, permutation = torch.full((n,), -1, dtype=torch.int64), torch.full((n,), -1, dtype=torch.int64)
    _merge.sort(keys.data_ptr(), n, pairs.data_ptr(), sorted_keys.data_ptr(), permutation.data_ptr())
    return sorted_keys, permutation


def _assert_sorts_as_torch(keys: torch.Tensor):
    keys = keys.contiguous()
    expected = torch.sort(keys, 0)
    sorted_keys, permutation = _ours(keys)
    assert torch.equal(sorted_keys, expected.values)
    assert torch.equal(permutation, expected.indices), "equal keys left in another order than torch's"


def _patterns(n: int, g: torch.Generator) -> dict:
    return {
        "few distinct": torch.randint(0, 5, (n,), generator=g),
        "skewed": (1_000_000 * torch.rand(n, generator=g, dtype=torch.float64).pow(3)).long(),
        "runs of three": torch.randperm(n, generator=g) // 3,
        "all equal": torch.full((n,), 7),
        "sorted": torch.arange(n) // 2,
        "reversed": torch.arange(n, 0, -1) // 2,
        "organ pipe": torch.cat([torch.arange(n // 2), torch.arange(n - n // 2, 0, -1)]) // 2,
        "wide, negative": torch.randint(-(1 << 62), 1 << 62, (n,), generator=g) // (1 << 50),
    }


# Around the insertion sort's runs (16), the partition's blocks (64: it runs blocks from two of them on),
# and torch's switch to a radix sort (32768).
@pytest.mark.parametrize("n", [0, 1, 2, 3, 15, 16, 17, 33, 127, 128, 129, 130, 255, 1000, 8193, 32767])
def test_the_same_permutation_as_torch(n):
    g = torch.Generator().manual_seed(n)
    for name, keys in _patterns(n, g).items():
        try:
            _assert_sorts_as_torch(keys)
        except AssertionError as error:
            raise AssertionError(f"{name}, n={n}: {error}") from None


def test_many_random_sizes_and_duplicate_rates():
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        n = int(torch.randint(0, 3000, (1,), generator=g))
        distinct = int(torch.randint(1, max(2, n), (1,), generator=g))
        _assert_sorts_as_torch(torch.randint(0, distinct, (n,), generator=g))


def test_the_heapsort_an_adversary_forces():
    """McIlroy's adversary ("A Killer Adversary for Quicksort", 1999) makes the quicksort go past its depth
    limit; the keys it leaves, and coarser copies of them with many equal keys, are sorted as torch does
    (``_reference`` shows the heapsort ran for each, so the test cannot pass without it)."""
    n = 3000
    keys = _adversary(n)
    forced = 0
    for coarse in (1, 2, 3, 5):
        coarser = torch.tensor(keys) // coarse
        forced += _reference(coarser.tolist())[1]
        _assert_sorts_as_torch(coarser)
    assert forced >= 2, f"the adversary forced the heapsort on {forced} inputs only"


def test_more_keys_than_torch_sorts_this_way_are_refused():
    keys = torch.zeros(_merge.SORTS_AS_TORCH_BELOW, dtype=torch.int64)
    with pytest.raises(ValueError, match="another algorithm"):
        _ours(keys)


def test_the_process_check_agrees_with_this_torch():
    assert sparse._sorts_as_torch()


@pytest.mark.parametrize("own_sort", [True, False])
@pytest.mark.parametrize("nnz", [0, 1, 3, 8192, 40000])
def test_a_rank_coalesces_with_torch_bits(monkeypatch, own_sort, nnz):
    """What the sort is for: this rank's duplicates summed as torch's coalesce() sums them, bit for bit,
    whether this sort runs or torch's (a torch whose sort differs; more keys than it repeats)."""
    monkeypatch.setattr(sparse, "_sorts_as_torch", lambda: own_sort)
    g = torch.Generator().manual_seed(nnz)
    rows = (50_000 * torch.rand(nnz, generator=g, dtype=torch.float64).pow(3)).long()  # hot rows repeat
    tensor = torch.sparse_coo_tensor(rows[None], torch.randn(nnz, 8, generator=g) * 1e3, (50_000, 8),
                                     check_invariants=True)
    buffers = sparse.Buffers()
    count = sparse._coalesce_into(tensor, buffers, sparse._sum_kernel(torch.float32))
    expected = tensor.coalesce()
    assert torch.equal(buffers.rows("indices", count, (1,), torch.int64), expected.indices().t())
    assert torch.equal(buffers.rows("values", count, (8,), torch.float32), expected.values())


# -- libstdc++'s std::sort in Python, with a comparison callback: the adversary needs one ------------------

def _reference(keys: list, less=None) -> tuple:
    """Sort positions 0..n-1 by ``less`` (default: by ``keys``) as std::sort does: (the positions in their
    sorted order, whether its heapsort ran)."""
    n = len(keys)
    less = less or (lambda x, y: keys[x] < keys[y])
    a = list(range(n))
    heapsorted = False

    def adjust_heap(first, hole, length, value):
        top, child = hole, hole
        while child < (length - 1) // 2:
            child = 2 * (child + 1)
            if less(a[first + child], a[first + child - 1]):
                child -= 1
            a[first + hole] = a[first + child]
            hole = child
        if length % 2 == 0 and child == (length - 2) // 2:
            child = 2 * (child + 1)
            a[first + hole] = a[first + child - 1]
            hole = child - 1
        parent = (hole - 1) // 2
        while hole > top and less(a[first + parent], value):
            a[first + hole] = a[first + parent]
            hole = parent
            parent = (hole - 1) // 2
        a[first + hole] = value

    def heapsort(first, last):
        length = last - first
        if length >= 2:
            for parent in range((length - 2) // 2, -1, -1):
                adjust_heap(first, parent, length, a[first + parent])
        while last - first > 1:
            last -= 1
            value, a[last] = a[last], a[first]
            adjust_heap(first, 0, last - first, value)

    def partition_pivot(first, last):
        mid = first + (last - first) // 2
        x, y, z = first + 1, mid, last - 1
        if less(a[x], a[y]):
            pick = y if less(a[y], a[z]) else (z if less(a[x], a[z]) else x)
        else:
            pick = x if less(a[x], a[z]) else (z if less(a[y], a[z]) else y)
        a[first], a[pick] = a[pick], a[first]
        lo, hi = first + 1, last
        while True:
            while less(a[lo], a[first]):
                lo += 1
            hi -= 1
            while less(a[first], a[hi]):
                hi -= 1
            if not lo < hi:
                return lo
            a[lo], a[hi] = a[hi], a[lo]
            lo += 1

    def introsort_loop(first, last, depth):
        nonlocal heapsorted
        while last - first > 16:
            if depth == 0:
                heapsorted = True
                heapsort(first, last)
                return
            depth -= 1
            cut = partition_pivot(first, last)
            introsort_loop(cut, last, depth)
            last = cut

    def linear_insert(i):
        value = a[i]
        while less(value, a[i - 1]):
            a[i] = a[i - 1]
            i -= 1
        a[i] = value

    def insertion_sort(first, last):
        for i in range(first + 1, last):
            if less(a[i], a[first]):
                a[first + 1:i + 1], a[first] = a[first:i], a[i]
            else:
                linear_insert(i)

    if n:
        introsort_loop(0, n, 2 * (n.bit_length() - 1))
        insertion_sort(0, min(n, 16))
        for i in range(16, n):
            linear_insert(i)
    return a, heapsorted


def _adversary(n: int) -> list:
    """Keys that make std::sort's quicksort take its worst path: McIlroy's antiqsort, which decides each
    comparison's answer only when asked, always against the element likely to be the pivot."""
    gas = n - 1
    value = [gas] * n
    state = {"solid": 0, "candidate": 0}

    def freeze(x):
        value[x] = state["solid"]
        state["solid"] += 1

    def less(x, y):
        if value[x] == gas and value[y] == gas:
            freeze(x if x == state["candidate"] else y)
        if value[x] == gas:
            state["candidate"] = x
        elif value[y] == gas:
            state["candidate"] = y
        return value[x] < value[y]

    _reference(value, less)
    return value


def test_the_reference_is_std_sort():
    """The Python copy the adversary runs on agrees with torch too (else its heapsort claim means nothing)."""
    g = torch.Generator().manual_seed(1)
    for n in (0, 5, 17, 200, 2000):
        keys = torch.randint(0, max(1, n // 4), (n,), generator=g)
        assert _reference(keys.tolist())[0] == torch.sort(keys, 0).indices.tolist()
