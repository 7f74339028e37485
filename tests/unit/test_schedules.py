"""The C schedules of shmcoll._schedules, with threads as ranks over one arena in this process.

The schedules release the GIL, so threads run them concurrently. With a wait
slice of one microsecond almost every wait expires and hands control back to
Python, which must resume the schedule at the right point: the resume paths
that real jobs reach only when a peer stalls for 100 ms are taken here
thousands of times. Results are compared with a float64 NumPy reference
(bitwise for integer dtypes), and every rank must agree bitwise.
"""
import threading
from datetime import timedelta

import numpy as np
import pytest

from shmcoll import _segment, arena as arena_module, kernel_library, kernels
from shmcoll.algorithms import allreduce, reduce_scatter
from shmcoll.descriptors import BEYOND_ANY_MESSAGE
from shmcoll.waits import SLEEP_AT_ONCE

CHUNK = 4096


def _arenas(size: int, monkeypatch, lanes: int = 1, chunk: int = CHUNK):
    """``size`` Arena handles (one per thread-rank) over one fresh segment, with 1 us wait slices."""
    monkeypatch.setattr(arena_module, "_SLICE_NS", 1000)
    layout = arena_module.layout(size, chunk, 1024, lanes)
    segment = _segment.create_unnamed("/dev/shm", layout.total)
    segment.release_fd()
    arena_module._init_header(segment, size, chunk, 1024, lanes)
    handles = [arena_module.Arena(segment, r, size, chunk, 1024, timedelta(seconds=30), SLEEP_AT_ONCE,
                                  list(range(size)), lanes)
               for r in range(size)]
    for handle in handles:
        handle._record_pid()
    return segment, handles


def _run_ranks(size: int, body):
    errors = []

    def run(rank):
        try:
            body(rank)
        except BaseException as error:  # reported below
            errors.append((rank, error))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a schedule hung"
    assert not errors, errors


def _inputs(size, count, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return [rng.integers(-50, 50, count).astype(dtype) for _ in range(size)]
    return [rng.standard_normal(count).astype(dtype) for _ in range(size)]


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("root", [None, 0, 1])
def test_chunked_all_reduce_and_reduce_resume_anywhere(size, dtype, root, monkeypatch):
    segment, handles = _arenas(size, monkeypatch)
    itemsize = np.dtype(dtype).itemsize
    entry = kernel_library.entry_point(np.dtype(dtype).name)
    # 0 and 1 element shares, odd counts, several chunks, and a count not divisible by the ranks.
    counts = [1, 2, 7, CHUNK // itemsize, 3 * CHUNK // itemsize + 5, 10 * CHUNK // itemsize - 1]
    inputs = {c: _inputs(size, c, dtype, c) for c in counts}
    outputs = {c: [x.copy() for x in inputs[c]] for c in counts}

    def body(rank):
        for c in counts:  # several collectives in a row: steps carry over
            buf = outputs[c][rank]
            allreduce.reduce_scatter_allgather(handles[rank], buf.ctypes.data, c, itemsize, entry, kernels.SUM,
                                               1.0, 1234, root=root)

    _run_ranks(size, body)
    for c in counts:
        expected = np.sum(np.stack(inputs[c]).astype(np.float64), axis=0)
        gatherers = range(size) if root is None else [root]
        for r in range(size):
            if r in gatherers:
                np.testing.assert_allclose(outputs[c][r], expected, rtol=1e-5, atol=1e-5)
                assert outputs[c][r].tobytes() == outputs[c][gatherers[0]].tobytes()
            else:
                assert np.array_equal(outputs[c][r], inputs[c][r]), "a non-root's input changed"
    del handles
    segment.close()


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_one_shot_steps_resume_anywhere_and_match_chunked(size, dtype, monkeypatch):
    """One-shot steps (one slot per step, the last one short) alternate with the chunked schedule on the
    same arena, whose steps and buffers they share; both give the reference's result, in the same bits."""
    segment, handles = _arenas(size, monkeypatch)
    itemsize = np.dtype(dtype).itemsize
    entry = kernel_library.entry_point(np.dtype(dtype).name)
    per = CHUNK // itemsize
    counts = [1, 2, 7, per - 1, per, per + 1, 3 * per + 5, 10 * per - 1]
    inputs = {c: _inputs(size, c, dtype, 100 + c) for c in counts}
    stepped = {c: [x.copy() for x in inputs[c]] for c in counts}
    chunked = {c: [x.copy() for x in inputs[c]] for c in counts}

    def body(rank):
        for c in counts:
            allreduce.one_shot_steps(handles[rank], stepped[c][rank].ctypes.data, c, itemsize, entry, kernels.SUM,
                                     1.0, 4321)
            allreduce.reduce_scatter_allgather(handles[rank], chunked[c][rank].ctypes.data, c, itemsize, entry,
                                               kernels.SUM, 1.0, 4321)

    _run_ranks(size, body)
    for c in counts:
        expected = np.sum(np.stack(inputs[c]).astype(np.float64), axis=0)
        for r in range(size):
            np.testing.assert_allclose(stepped[c][r], expected, rtol=1e-5, atol=1e-5)
            assert stepped[c][r].tobytes() == chunked[c][r].tobytes(), (c, r)
    del handles
    segment.close()


@pytest.mark.parametrize("size", [2, 4])
def test_one_shot_and_reduce_scatter_resume(size, monkeypatch):
    segment, handles = _arenas(size, monkeypatch)
    entry = kernel_library.entry_point("float32")
    block = 3 * CHUNK // (4 * size) + 1  # several steps of pieces, the last one short
    small = _inputs(size, 5, np.float32, 1)
    scattered = _inputs(size, block * size, np.float32, 2)
    small_out = [x.copy() for x in small]
    scatter_out = [np.zeros(block, np.float32) for _ in range(size)]

    def body(rank):
        for _ in range(20):
            small_out[rank][:] = small[rank]
            allreduce.one_shot(handles[rank], small_out[rank].ctypes.data, 5, 4, entry, kernels.SUM, 1.0, 99)
        reduce_scatter.reduce_scatter(handles[rank], scattered[rank].ctypes.data, block, 4, entry, kernels.MAX,
                                      1.0, scatter_out[rank].ctypes.data, 77)

    _run_ranks(size, body)
    expected_small = np.sum(np.stack(small).astype(np.float64), axis=0)
    expected_scatter = np.max(np.stack(scattered), axis=0).reshape(size, block)
    for r in range(size):
        np.testing.assert_allclose(small_out[r], expected_small, rtol=1e-5)
        assert small_out[r].tobytes() == small_out[0].tobytes()
        assert np.array_equal(scatter_out[r], expected_scatter[r])
    del handles
    segment.close()


@pytest.mark.parametrize("schedule", [allreduce.reduce_scatter_allgather, allreduce.one_shot_steps])
def test_mismatch_is_raised_after_a_resume(schedule, monkeypatch):
    """Two thread-ranks run different collectives: both raise, naming the other's, their tensors untouched."""
    from shmcoll.errors import CollectiveError

    segment, handles = _arenas(2, monkeypatch)
    entry = kernel_library.entry_point("float32")
    data = [np.ones(4 * CHUNK, np.float32) for _ in range(2)]
    raised = []

    def body(rank):
        try:
            schedule(handles[rank], data[rank].ctypes.data, 4 * CHUNK, 4, entry, kernels.SUM, 1.0, 1000 + rank)
        except CollectiveError as error:
            raised.append(str(error))

    _run_ranks(2, body)
    assert len(raised) == 2 and all("mismatched collectives" in text for text in raised), raised
    assert all(np.array_equal(d, np.ones(4 * CHUNK, np.float32)) for d in data), "a mismatch wrote a tensor"
    del handles
    segment.close()


@pytest.mark.parametrize("size", [2, 3])
def test_allgather_resume(size, monkeypatch):
    from shmcoll.algorithms import allgather

    segment, handles = _arenas(size, monkeypatch)
    for nbytes in (1, 7, CHUNK, 3 * CHUNK + 5):
        inputs = [np.random.default_rng(nbytes + r).integers(0, 255, nbytes, dtype=np.uint8) for r in range(size)]
        outputs = [np.zeros(size * nbytes, np.uint8) for _ in range(size)]
        _run_ranks(size, lambda rank: allgather.allgather(handles[rank], inputs[rank].ctypes.data, nbytes,
                                                          (outputs[rank].ctypes.data, nbytes), 55))
        for r in range(size):
            assert np.array_equal(outputs[r], np.concatenate(inputs))
    del handles
    segment.close()



@pytest.mark.parametrize("size", [2, 3])
def test_allgather_streamed_gives_the_same_bytes(size, monkeypatch):
    """An all-gather whose output reaches the streaming threshold (here every one: ``set_streaming(1)``) writes
    it with streaming stores (shmcoll.streaming): the same bytes at every size, wherever the output starts
    (the stores need 16-byte alignment, so a head is copied plainly), in place or not, resumed or not."""
    from shmcoll.algorithms import allgather

    segment, handles = _arenas(size, monkeypatch)
    for handle in handles:
        handle.schedule.set_streaming(1)
    for nbytes in (1, 15, 63, 64, 65, 127, CHUNK, 3 * CHUNK + 5):
        for offset in (0, 1, 9):
            inputs = [np.random.default_rng(nbytes + r).integers(0, 255, nbytes, dtype=np.uint8) for r in range(size)]
            buffers = [np.zeros(size * nbytes + offset, np.uint8) for _ in range(size)]
            _run_ranks(size, lambda rank: allgather.allgather(handles[rank], inputs[rank].ctypes.data, nbytes,
                                                              (buffers[rank].ctypes.data + offset, nbytes), 56))
            for r in range(size):
                assert np.array_equal(buffers[r][offset:], np.concatenate(inputs)), (nbytes, offset, r)
                assert not buffers[r][:offset].any()
            in_place = [np.concatenate([np.zeros(offset, np.uint8)] + [inputs[q] if q == r else
                                                                       np.zeros(nbytes, np.uint8)
                                                                       for q in range(size)]) for r in range(size)]
            _run_ranks(size, lambda rank: allgather.allgather(
                handles[rank], in_place[rank].ctypes.data + offset + rank * nbytes, nbytes,
                (in_place[rank].ctypes.data + offset, nbytes), 57))
            for r in range(size):
                assert np.array_equal(in_place[r][offset:], np.concatenate(inputs)), (nbytes, offset, r, "in place")
    del handles
    segment.close()


def test_the_streaming_threshold_follows_the_cache():
    """An all-gather streams where the node's outputs and inputs outgrow the last-level cache; never where its
    size is unknown."""
    from shmcoll import streaming

    assert streaming.least_output_bytes(2, 32 << 20) == (32 << 20) // 3 + 1
    assert streaming.least_output_bytes(4, 300 << 20) == 60 << 20 | 1
    assert streaming.least_output_bytes(4, 0) == BEYOND_ANY_MESSAGE
    assert streaming.last_level_cache_bytes() >= 0


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("root", [0, 1])
def test_broadcast_resume(size, root, monkeypatch):
    from shmcoll.algorithms import broadcast

    segment, handles = _arenas(size, monkeypatch)
    for nbytes in (1, 7, size * CHUNK, 3 * size * CHUNK + 5):
        data = np.random.default_rng(nbytes).integers(0, 255, nbytes, dtype=np.uint8)
        buffers = [data.copy() if r == root else np.zeros(nbytes, np.uint8) for r in range(size)]
        _run_ranks(size, lambda rank: broadcast.broadcast(handles[rank], buffers[rank].ctypes.data, nbytes, root, 66))
        for r in range(size):
            assert np.array_equal(buffers[r], data), (nbytes, r)
    del handles
    segment.close()


@pytest.mark.parametrize("size", [2, 3, 4])
def test_gather_and_scatter_resume_back_to_back(size, monkeypatch):
    """Gathers and scatters one after another, the root moving and the size changing from call to call (one byte
    to several slots), with 1 us slices: a rank that leaves one early (every rank but a gather's root, a scatter's
    root) starts the next while its peers are resumed in this one, and every byte lands where torch puts it."""
    from shmcoll.algorithms import gather, scatter

    segment, handles = _arenas(size, monkeypatch)
    calls = [(kind, root, nbytes) for nbytes in (1, 7, CHUNK, 3 * CHUNK + 5) for root in range(size)
             for kind in ("gather", "scatter")]
    inputs = [[np.random.default_rng((call, r)).integers(0, 255, size * nbytes, dtype=np.uint8) for r in range(size)]
              for call, (_, _, nbytes) in enumerate(calls)]
    outputs = [[np.zeros(size * nbytes, np.uint8) for _ in range(size)] for _, _, nbytes in calls]

    def body(rank):
        for call, (kind, root, nbytes) in enumerate(calls):
            mine, into = inputs[call][rank], outputs[call][rank]
            blocks = [into.ctypes.data + j * nbytes for j in range(size)]
            if kind == "gather":
                gather.gather(handles[rank], mine.ctypes.data, nbytes, root, blocks, 90 + call)
            else:
                scatter.scatter(handles[rank], [mine.ctypes.data + j * nbytes for j in range(size)], nbytes, root,
                                into.ctypes.data, 90 + call)

    _run_ranks(size, body)
    for call, (kind, root, nbytes) in enumerate(calls):
        for r in range(size):
            if kind == "gather":
                expected = (np.concatenate([inputs[call][j][:nbytes] for j in range(size)]) if r == root
                            else np.zeros(size * nbytes, np.uint8))
            else:
                expected = np.concatenate([inputs[call][root][r * nbytes:(r + 1) * nbytes],
                                           np.zeros((size - 1) * nbytes, np.uint8)])
            assert np.array_equal(outputs[call][r], expected), (kind, root, nbytes, r)
    del handles
    segment.close()


@pytest.mark.parametrize("kind", ["gather", "scatter"])
@pytest.mark.parametrize("root", [0, 1])
@pytest.mark.parametrize("nbytes", [7, 3 * CHUNK + 5])
def test_gather_and_scatter_against_another_collective_raise(kind, root, nbytes, monkeypatch):
    """Rank 0 runs a gather or scatter to or from ``root`` while rank 1 runs an all-gather: the ranks that wait
    for the other (a gather's root, a scatter's other rank, and every rank once a message takes several slots)
    raise, naming both collectives, and rank 1's output stays as it was."""
    from shmcoll.algorithms import allgather, gather, scatter
    from shmcoll.errors import CollectiveError

    segment, handles = _arenas(2, monkeypatch)
    data = [np.arange(2 * nbytes, dtype=np.uint8) for _ in range(2)]
    outs = [np.zeros(2 * nbytes, np.uint8) for _ in range(2)]
    raised = {}

    def body(rank):
        try:
            if rank == 1:
                allgather.allgather(handles[1], data[1].ctypes.data, nbytes, (outs[1].ctypes.data, nbytes), 200)
            elif kind == "gather":
                gather.gather(handles[0], data[0].ctypes.data, nbytes, root,
                              [outs[0].ctypes.data, outs[0].ctypes.data + nbytes], 201)
            else:
                scatter.scatter(handles[0], [data[0].ctypes.data, data[0].ctypes.data + nbytes], nbytes, root,
                                outs[0].ctypes.data, 201)
        except CollectiveError as error:
            raised[rank] = str(error)

    _run_ranks(2, body)
    rank_0_waits = nbytes > CHUNK or (root == 0) == (kind == "gather")
    assert {0, 1} - set(raised) <= ({1} if rank_0_waits else {0}), raised
    assert all("mismatched collectives" in text for text in raised.values()), raised
    assert not outs[1].any(), "a mismatch wrote the all-gather's output"
    del handles
    segment.close()


def _alltoall_sizes(size: int, call: int) -> list[list[int]]:
    """Bytes rank r sends rank j in the ``call``-th all-to-all of a run: uneven, some empty, some several
    parts long, and changing from call to call (so the number of steps does too)."""
    shapes = (0, 1, 63, CHUNK // 2 + 3, CHUNK + 1, 3 * CHUNK + 7)
    return [[shapes[(3 * r + j + call) % len(shapes)] for j in range(size)] for r in range(size)]


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("streamed", [False, True])
def test_alltoall_resume_back_to_back(size, streamed, monkeypatch):
    """All-to-alls one after another with no pause between them, each rank's sizes its own and changing: a rank
    resumed late in one (1 us slices) while a peer that finished has begun the next and rewritten its size
    table still moves every byte of this one; the largest flag any rank gave comes back on every rank. The same
    bytes where the outputs are written with streaming stores (``set_streaming(1)``: every output)."""
    from shmcoll.algorithms import alltoall

    segment, handles = _arenas(size, monkeypatch)
    for handle in handles:
        handle.schedule.set_streaming(1 if streamed else BEYOND_ANY_MESSAGE)
    calls = 12
    inputs = [[[np.random.default_rng((call, r, j)).integers(0, 255, n, dtype=np.uint8)
                for j, n in enumerate(_alltoall_sizes(size, call)[r])] for r in range(size)] for call in range(calls)]
    outputs = [[[np.zeros(_alltoall_sizes(size, call)[j][r], np.uint8) for j in range(size)] for r in range(size)]
               for call in range(calls)]
    flags = [[None] * size for _ in range(calls)]

    def body(rank):
        for call in range(calls):
            send = [(block.ctypes.data, block.nbytes) for block in inputs[call][rank]]
            recv = [(block.ctypes.data, block.nbytes) for block in outputs[call][rank]]
            flags[call][rank] = alltoall.alltoall(handles[rank], send, recv, 70 + call, flag=call * 10 + rank)

    _run_ranks(size, body)
    for call in range(calls):
        for r in range(size):
            for j in range(size):
                assert np.array_equal(outputs[call][r][j], inputs[call][j][r]), (call, j, r)
        assert flags[call] == [call * 10 + size - 1] * size
    del handles
    segment.close()


@pytest.mark.parametrize("size", [2, 3])
def test_alltoall_sizes_that_disagree_raise_on_every_rank(size, monkeypatch):
    """Rank 1 expects one byte more from rank 0 than rank 0 sends: every rank raises, naming both ranks and both
    sizes, after the first step and with no output written."""
    from shmcoll.algorithms import alltoall
    from shmcoll.errors import SizesDisagreeError

    segment, handles = _arenas(size, monkeypatch)
    sent = [[np.full(CHUNK + 5, r, np.uint8) for _ in range(size)] for r in range(size)]
    room = [[np.zeros(CHUNK + 5 + (r == 1 and j == 0), np.uint8) for j in range(size)] for r in range(size)]
    raised = [None] * size

    def body(rank):
        try:
            alltoall.alltoall(handles[rank], [(b.ctypes.data, b.nbytes) for b in sent[rank]],
                              [(b.ctypes.data, b.nbytes) for b in room[rank]], 90)
        except SizesDisagreeError as error:
            raised[rank] = str(error)

    _run_ranks(size, body)
    assert all(text and "rank 0" in text and "rank 1" in text and str(CHUNK + 5) in text and str(CHUNK + 6) in text
               for text in raised), raised
    assert not any(block.any() for blocks in room for block in blocks), "an all-to-all whose sizes disagree wrote"
    del handles
    segment.close()


def _with_lanes(size: int, lanes: int, body, monkeypatch):
    """Run ``body(rank, Lanes)`` on ``size`` thread-ranks whose arena has ``lanes`` lanes (native threads)."""
    from shmcoll.lanes import Lanes

    segment, handles = _arenas(size, monkeypatch, lanes)
    pools = [Lanes(handles[r], 4096) for r in range(size)]
    try:
        _run_ranks(size, lambda rank: body(rank, pools[rank]))
    finally:
        for pool in pools:
            pool.close()
        del handles
        segment.close()


@pytest.mark.parametrize("size, lane_counts", [(2, (2, 3, 4, 8, 16)), (3, (2, 3, 4))])
def test_lanes_give_one_threads_bits(size, lane_counts, monkeypatch):
    """Every lane-split collective equals its one-lane result bit for bit, and the reference; twice in a row,
    with one-shots on the arena's own steps between (lanes and the arena keep separate steps and slots)."""
    from shmcoll import lanes as L
    from shmcoll.algorithms import allgather, broadcast

    count = 5 * CHUNK + 13  # float32: several lanes, several steps per lane, a ragged end
    inputs = _inputs(size, count * size, np.float32, 5)
    # The list form of all_gather: rank q's block at its own address, in reverse rank order with uneven gaps
    # (no stride gives them); in place as well, rank r's block being its input.
    gap = [64 * p * p + 7 * p for p in range(size)]  # before the block in position p
    at = [(size - 1 - q) * count * 4 + gap[size - 1 - q] for q in range(size)]
    span = size * count * 4 + gap[-1]
    entry = kernel_library.entry_point("float32")
    results = {}
    for lanes in (1, *lane_counts):
        out = {"ar": [x[:count].copy() for x in inputs], "red": [x[:count].copy() for x in inputs],
               "os": [x[:CHUNK // 4].copy() for x in inputs],
               "rs": [np.zeros(count, np.float32) for _ in range(size)],
               "rs_in_place": [x.copy() for x in inputs],  # rank r's output: block r of its input
               "ag": [np.zeros(size * count * 4, np.uint8) for _ in range(size)],
               "ag_list": [np.zeros(span, np.uint8) for _ in range(size)],
               "ag_list_in_place": [np.zeros(span, np.uint8) for _ in range(size)],
               "bc": [x[:count].copy() for x in inputs]}

        def body(rank, pool):
            arena = pool.arena

            def run(kind, desc, n, itemsize, addr, run_alone, **job):
                if lanes == 1:
                    return run_alone()
                pool.run(kind, lanes, desc, n, itemsize, addr, **job)

            for _ in range(2):
                out["ar"][rank][:] = inputs[rank][:count]
                a = out["ar"][rank].ctypes.data
                run(L.CHUNKED, 7, count, 4, a, lambda: allreduce.reduce_scatter_allgather(
                    arena, a, count, 4, entry, kernels.SUM, 1.0, 7), kernel=entry, op=kernels.SUM)
                allreduce.one_shot(arena, out["bc"][rank][:3].ctypes.data, 3, 4, entry, kernels.MAX, 1.0, 6)
            o = out["os"][rank].ctypes.data
            run(L.ONE_SHOT, 12, CHUNK // 4, 4, o, lambda: allreduce.one_shot(
                arena, o, CHUNK // 4, 4, entry, kernels.SUM, 1.0, 12), kernel=entry, op=kernels.SUM)
            r_ = out["red"][rank].ctypes.data
            run(L.CHUNKED, 8, count, 4, r_, lambda: allreduce.reduce_scatter_allgather(
                arena, r_, count, 4, entry, kernels.SUM, 1.0, 8, root=1), kernel=entry, op=kernels.SUM, root=1)
            src, dst = inputs[rank].ctypes.data, out["rs"][rank].ctypes.data
            run(L.REDUCE_SCATTER, 9, count, 4, src, lambda: reduce_scatter.reduce_scatter(
                arena, src, count, 4, entry, kernels.SUM, 1.0, dst, 9, block_stride=count), out=dst,
                block_stride=count, kernel=entry, op=kernels.SUM)
            whole = out["rs_in_place"][rank].ctypes.data
            own = whole + rank * count * 4
            run(L.REDUCE_SCATTER, 13, count, 4, whole, lambda: reduce_scatter.reduce_scatter(
                arena, whole, count, 4, entry, kernels.SUM, 1.0, own, 13, block_stride=count), out=own,
                block_stride=count, kernel=entry, op=kernels.SUM)
            g = out["ag"][rank].ctypes.data
            run(L.ALLGATHER, 10, count * 4, 1, src, lambda: allgather.allgather(
                arena, src, count * 4, (g, count * 4), 10), out=g, out_stride=count * 4)
            for name, desc in (("ag_list", 14), ("ag_list_in_place", 15)):
                outputs = [out[name][rank].ctypes.data + at[q] for q in range(size)]
                own = src
                if name == "ag_list_in_place":
                    out[name][rank][at[rank]:at[rank] + count * 4] = inputs[rank][:count].view(np.uint8)
                    own = outputs[rank]
                blocks = allgather.Blocks(outputs, count * 4)
                run(L.ALLGATHER, desc, count * 4, 1, own, lambda: allgather.allgather(
                    arena, own, count * 4, outputs, desc), out=blocks.out, out_stride=blocks.stride,
                    blocks=blocks.table)
            b = out["bc"][rank].ctypes.data
            run(L.BROADCAST, 11, count * 4, 1, b, lambda: broadcast.broadcast(arena, b, count * 4, 0, 11), root=0)

        _with_lanes(size, max(lanes, 2), body, monkeypatch)
        results[lanes] = out
    stacked = np.stack(inputs)
    expected_sum = np.sum(stacked[:, :count].astype(np.float64), axis=0)
    expected_rs = np.sum(stacked.astype(np.float64), axis=0).reshape(size, count)
    for r in range(size):
        np.testing.assert_allclose(results[1]["ar"][r], expected_sum, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(results[1]["red"][1], expected_sum, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(results[1]["os"][r], expected_sum[:CHUNK // 4], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(results[1]["rs"][r], expected_rs[r], rtol=1e-5, atol=1e-5)
        in_place = results[1]["rs_in_place"][r].reshape(size, count)
        assert in_place[r].tobytes() == results[1]["rs"][r].tobytes()
        assert np.array_equal(np.delete(in_place, r, axis=0), np.delete(inputs[r].reshape(size, count), r, axis=0))
        assert results[1]["ag"][r].tobytes() == b"".join(x[:count].tobytes() for x in inputs)
        for name in ("ag_list", "ag_list_in_place"):
            expected = np.zeros(span, np.uint8)
            for q in range(size):
                expected[at[q]:at[q] + count * 4] = inputs[q][:count].view(np.uint8)
            assert np.array_equal(results[1][name][r], expected), (name, r)
        bc = inputs[0][:count].copy()
        bc[:3] = np.max(stacked[:, :3], axis=0)
        assert np.array_equal(results[1]["bc"][r], bc)
    for lanes in lane_counts:
        for name, per_rank in results[lanes].items():
            for r in range(size):
                if name == "red" and r != 1:
                    continue
                assert per_rank[r].tobytes() == results[1][name][r].tobytes(), (lanes, name, r)


def test_lanes_of_ranks_in_different_collectives_raise_at_once(monkeypatch):
    """Rank 0 runs an all-reduce over 3 lanes, rank 1 a broadcast over 3 lanes, then the other way round with
    rank 1 on the arena's own steps: every rank raises 'mismatched collectives' within seconds (timeout 30 s),
    and every lane thread is back (the pool runs the next collective)."""
    import time

    from shmcoll import lanes as L
    from shmcoll.errors import CollectiveError

    count = 8 * CHUNK
    data = [np.ones(count, np.float32) for _ in range(2)]
    entry = kernel_library.entry_point("float32")

    def broadcast_over_lanes(pool, a):
        pool.run(L.BROADCAST, 3, 6, count * 4, 1, a, root=0)

    def one_shot_on_the_arena(pool, a):
        allreduce.one_shot(pool.arena, a, 4, 4, entry, kernels.SUM, 1.0, 7)

    for rank_1_runs in (broadcast_over_lanes, one_shot_on_the_arena):
        raised = {}

        def body(rank, pool):
            a = data[rank].ctypes.data
            start = time.monotonic()
            try:
                if rank == 0:
                    pool.run(L.CHUNKED, 3, 5, count, 4, a, kernel=entry, op=kernels.SUM)
                else:
                    rank_1_runs(pool, a)
            except CollectiveError as error:
                raised[rank] = (str(error), time.monotonic() - start)

        _with_lanes(2, 3, body, monkeypatch)
        assert set(raised) == {0, 1}, (rank_1_runs.__name__, raised)
        assert all("mismatched collectives" in text and seconds < 10 for text, seconds in raised.values()), \
            (rank_1_runs.__name__, raised)


def test_an_aborted_rank_stops_every_lane(monkeypatch):
    """Rank 1 never joins; rank 0's lanes wait for it until abort() (from another thread): it raises within a
    second, and its lane threads are free again (a join of the pool would hang otherwise)."""
    import time

    from shmcoll import lanes as L
    from shmcoll.errors import AbortedError

    count = 8 * CHUNK
    data = np.ones(count, np.float32)
    entry = kernel_library.entry_point("float32")
    raised = []

    def body(rank, pool):
        if rank == 1:
            return
        timer = threading.Timer(0.3, lambda: pool.arena.abort("test"))
        timer.start()
        start = time.monotonic()
        try:
            pool.run(L.CHUNKED, 3, 5, count, 4, data.ctypes.data, kernel=entry, op=kernels.SUM)
        except AbortedError:
            raised.append(time.monotonic() - start)

    _with_lanes(2, 3, body, monkeypatch)
    assert len(raised) == 1 and raised[0] < 2, raised


@pytest.mark.parametrize("size", [2, 3])
def test_single_copy_gives_the_copy_paths_bits(size, monkeypatch):
    """The single-copy schedules (peers' buffers read with process_vm_readv; here the thread-ranks share one
    pid) against the copy path on random float32: all-reduce, reduce and reduce-scatter bitwise, every rank
    alike, all-gather and broadcast exact; several in a row, 1 us wait slices (every resume point taken); on
    one thread and with the reads and reductions split over 2-4 lanes (each rank's lane threads)."""
    from shmcoll.algorithms import allgather, broadcast
    from shmcoll.lanes import Lanes

    chunk = 32 << 10  # room in the scratch for 4 lanes' rows (LEAST_ROW_BYTES in _ext/single_copy.pyx)
    segment, handles = _arenas(size, monkeypatch, lanes=4, chunk=chunk)
    pools = [Lanes(handle, 4096) for handle in handles]
    for handle in handles:
        handle.enable_single_copy()
    entry = kernel_library.entry_point("float32")
    counts = [1, 7, 1000, 3 * chunk + 5]  # pieces of the scratch: several for the largest, on every lane
    lane_counts = (1, 2, 3, 4)
    data = {c: _inputs(size, c * size, np.float32, c) for c in counts}
    copy = {c: [x.copy() for x in data[c]] for c in counts}
    reduced = {c: [x.copy() for x in data[c]] for c in counts}
    scattered = {c: [np.zeros(c, np.float32) for _ in range(size)] for c in counts}
    single = {(c, n): [x.copy() for x in data[c]] for c in counts for n in lane_counts}
    rooted = {(c, n): [x.copy() for x in data[c]] for c in counts for n in lane_counts}
    sc_scattered = {(c, n): [np.zeros(c, np.float32) for _ in range(size)] for c in counts for n in lane_counts}
    gathered = {(c, n): [np.zeros(c * size, np.float32) for _ in range(size)] for c in counts for n in lane_counts}
    sent = {(c, n): [data[c][0][:c].copy() if r == size - 1 else np.zeros(c, np.float32) for r in range(size)]
            for c in counts for n in lane_counts}

    def body(rank):
        arena = handles[rank]
        pools[rank].attach_single_copy(arena.single_copy)
        for c in counts:
            allreduce.reduce_scatter_allgather(arena, copy[c][rank].ctypes.data, c * size, 4, entry, kernels.SUM,
                                               1.0, 17)
            allreduce.reduce_scatter_allgather(arena, reduced[c][rank].ctypes.data, c * size, 4, entry,
                                               kernels.SUM, 1.0, 16, root=1)
            reduce_scatter.reduce_scatter(arena, data[c][rank].ctypes.data, c, 4, entry, kernels.SUM, 1.0,
                                          scattered[c][rank].ctypes.data, 18)
            for n in lane_counts:
                allreduce.single_copy(arena, single[c, n][rank].ctypes.data, c * size, 4, entry, kernels.SUM, 1.0,
                                      17, lanes=n)
                allreduce.single_copy(arena, rooted[c, n][rank].ctypes.data, c * size, 4, entry, kernels.SUM, 1.0,
                                      16, root=1, lanes=n)
                reduce_scatter.single_copy(arena, data[c][rank].ctypes.data, c, 4, entry, kernels.SUM, 1.0,
                                           sc_scattered[c, n][rank].ctypes.data, 18, lanes=n)
                allgather.single_copy(arena, data[c][rank].ctypes.data, c * 4, gathered[c, n][rank].ctypes.data,
                                      c * 4, 19, lanes=n)
                broadcast.single_copy(arena, sent[c, n][rank].ctypes.data, c * 4, size - 1, 20, lanes=n)

    try:
        _run_ranks(size, body)
    finally:
        for pool in pools:
            pool.close()
        segment.close()
    for c in counts:
        for n in lane_counts:
            for r in range(size):
                assert single[c, n][r].tobytes() == copy[c][0].tobytes(), (c, n, r)
                assert sc_scattered[c, n][r].tobytes() == scattered[c][r].tobytes(), (c, n, r)
                assert np.array_equal(gathered[c, n][r], np.concatenate([data[c][p][:c] for p in range(size)])), \
                    (c, n, r)
                assert np.array_equal(sent[c, n][r], data[c][0][:c]), (c, n, r)
            assert rooted[c, n][1].tobytes() == reduced[c][1].tobytes(), (c, n)


def test_a_read_failing_on_any_lane_fails_the_collective(monkeypatch):
    """Single copy over 2 lanes: the root's buffer is readable in its first half only (its second page
    unmapped), so only lane 1's read fails (EFAULT): the reader raises naming the root and the errno, and
    the root, abandoned, raises too; neither returns as if the broadcast had moved its bytes."""
    import ctypes

    from shmcoll.algorithms import broadcast
    from shmcoll.lanes import Lanes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = 4096
    half_mapped = libc.mmap(None, 2 * page, 3, 0x22, -1, 0)  # PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
    assert half_mapped not in (None, ctypes.c_void_p(-1).value)
    assert libc.munmap(half_mapped + page, page) == 0
    segment, handles = _arenas(2, monkeypatch, lanes=2, chunk=32 << 10)
    pools = [Lanes(handle, 4096) for handle in handles]
    for handle in handles:
        handle.enable_single_copy()
    into = np.zeros(2 * page, np.uint8)
    raised = {}

    def body(rank):
        pools[rank].attach_single_copy(handles[rank].single_copy)
        try:
            broadcast.single_copy(handles[rank], half_mapped if rank == 0 else into.ctypes.data, 2 * page, 0, 20,
                                  lanes=2)
        except Exception as error:  # compared below
            raised[rank] = error

    try:
        _run_ranks(2, body)
    finally:
        for pool in pools:
            pool.close()
        segment.close()
        libc.munmap(half_mapped, page)
    assert 1 in raised and "EFAULT" in str(raised[1]) and "rank 0" in str(raised[1]), raised
    assert 0 in raised, raised
