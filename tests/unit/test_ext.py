"""The Cython layer alone: segments, process-shared waits, copies."""
import contextlib
import errno
import multiprocessing as mp
import os
import stat
import time

import numpy as np
import pytest

from shmcoll import _copy, _segment, _sync
from tests.ext_source import constant

SHM = "/dev/shm"


def _path(tag):
    return os.path.join(SHM, f"shmcoll-test-{os.getpid()}-{tag}")


@contextlib.contextmanager
def _fresh_segment(tag, size=4096):
    """A segment made for this test at ``_path(tag)``, yielded with its path; unlinked and closed after."""
    path = _path(tag)
    seg = _segment.create(path, size)
    try:
        yield seg, path
    finally:
        _segment.unlink_path(path)
        seg.close()


def test_create_is_exclusive_private_and_reserved():
    path = _path("create")
    seg = _segment.create(path, 1 << 20)
    try:
        info = os.stat(path)
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_blocks * 512 >= 1 << 20  # posix_fallocate reserved the pages
        with pytest.raises(FileExistsError):
            _segment.create(path, 4096)
        view = np.frombuffer(seg, dtype=np.uint8)
        view[:3] = [1, 2, 3]
        other = _segment.attach(path, 1 << 20)
        assert list(np.frombuffer(other, dtype=np.uint8)[:3]) == [1, 2, 3]
        other.close()
    finally:
        _segment.unlink_path(path)
    assert not os.path.exists(path)
    view[3] = 4  # still mapped after unlink
    assert view[3] == 4


def test_create_refuses_a_symlink():
    target, link = _path("target"), _path("link")
    os.symlink(target, link)
    try:
        with pytest.raises(FileExistsError):
            _segment.create(link, 4096)
        assert not os.path.exists(target)
    finally:
        os.unlink(link)


def test_full_filesystem_is_a_clear_error_and_leaves_nothing():
    path = _path("huge")
    too_big = _segment.free_bytes(SHM) + (1 << 30)
    with pytest.raises(OSError) as info:
        _segment.create(path, too_big)
    assert info.value.errno == errno.ENOSPC
    assert str(too_big) in str(info.value) and "free" in str(info.value)
    assert not os.path.exists(path)


def test_attach_checks_size():
    with _fresh_segment("small") as (_, path):
        with pytest.raises(OSError, match="holds 4096 bytes"):
            _segment.attach(path, 8192)


def test_close_waits_for_exported_buffers():
    path = _path("close")
    seg = _segment.create(path, 4096)
    _segment.unlink_path(path)
    view = np.frombuffer(seg, dtype=np.uint8)
    seg.close()
    assert seg.closed
    view[0] = 7  # the mapping lives until the view is gone
    assert view[0] == 7
    with pytest.raises(ValueError):
        np.frombuffer(seg, dtype=np.uint8)
    del view


def test_copy():
    src = np.arange(1 << 18, dtype=np.uint8)
    dst = np.zeros_like(src)
    _copy.copy(dst.ctypes.data, src.ctypes.data, src.nbytes)
    assert np.array_equal(src, dst)


def _poster(path, delay, step):
    seg = _segment.attach(path, 4096)
    time.sleep(delay)
    _sync.post(seg.address, 1, step, 1234)
    seg.close()


@pytest.mark.parametrize("spin_ns,yield_ns", [(10**9, 0), (0, 10**9), (0, 0)])
def test_wait_wakes_on_post_from_another_process(spin_ns, yield_ns):
    """Spin, yield and futex-sleep phases each see a post from another process promptly."""
    with _fresh_segment("wait") as (seg, path):
        proc = mp.get_context("fork").Process(target=_poster, args=(path, 0.2, 5))
        proc.start()
        start = time.monotonic()
        behind = _sync.wait_ranks(seg.address, 0, 2, 0, 5, spin_ns, yield_ns, 5 * 10**9)
        elapsed = time.monotonic() - start
        proc.join()
        assert behind == -1
        assert 0.15 < elapsed < 2.0, elapsed
        assert _sync.load_step(seg.address, 1) == 5 and _sync.load_desc(seg.address, 1, 5) == 1234


def test_wait_slice_expires_and_names_the_rank():
    with _fresh_segment("slice") as (seg, _):
        _sync.post(seg.address, 1, 3, 0)
        start = time.monotonic()
        assert _sync.wait_ranks(seg.address, 0, 3, 0, 3, 0, 0, 50_000_000) == 2  # rank 2 is behind
        assert 0.04 < time.monotonic() - start < 1.0
        assert _sync.wait_rank(seg.address, 1, 3, 0, 0, 1000)
        assert _sync.first_mismatch(seg.address, 0, 3, 3, 99) == 1
        assert _sync.first_mismatch(seg.address, 0, 3, 3, 0) == -1
        # A peer one step ahead writes another descriptor slot: step 3's stays readable.
        _sync.post(seg.address, 2, 3, 0)
        _sync.post(seg.address, 1, 4, 77)
        assert _sync.load_desc(seg.address, 1, 3) == 0 and _sync.load_desc(seg.address, 1, 4) == 77
        assert _sync.first_mismatch(seg.address, 0, 3, 3, 0) == -1


@contextlib.contextmanager
def _pinned_lines(tag):
    """A fresh segment of control lines, as uint32 words, with this process pinned to one CPU (yielded)."""
    mask = os.sched_getaffinity(0)
    with _fresh_segment(tag) as (seg, _):
        try:
            cpu = max(mask)
            os.sched_setaffinity(0, {cpu})
            yield seg, np.frombuffer(seg, dtype=np.uint32), cpu
        finally:
            os.sched_setaffinity(0, mask)


CPU_OFFSET = constant("schedule.pxd", "_CPU")  # of the CPU a rank last waited on, in its control line


def _cpu_word(rank):
    return (rank * _sync.LINE_BYTES + CPU_OFFSET) // 4


def test_an_oversubscribed_wait_records_the_cpu_it_waits_on():
    with _pinned_lines("cpu") as (seg, words, cpu):
        words[_cpu_word(1)] = cpu + 1000
        assert _sync.wait_ranks(seg.address, 0, 2, 1, 0, 0, 10**6, 10**6, 0) == -1  # no company: not recorded
        assert words[_cpu_word(1)] == cpu + 1000
        assert _sync.wait_ranks(seg.address, 0, 2, 1, 0, 0, 10**6, 10**6, 2) == -1
        assert words[_cpu_word(1)] == cpu


@pytest.mark.parametrize("peer_here,yield_company,yields", [
    (True, 2, True),    # a peer last waited on this core: yielding can hand it the core
    (False, 2, False),  # alone on the core: sleep at once
    (False, 0, True),   # no company given (local ranks fit the cores): yield regardless
])
def test_an_oversubscribed_wait_yields_only_beside_a_peer(peer_here, yield_company, yields):
    """A wait whose peer never comes either loops on sched_yield for its whole slice (using CPU time) or
    sleeps on the futex (none), by where the other ranks last waited."""
    with _pinned_lines("company") as (seg, words, cpu):
        # Ranks 1 and 2 are behind; rank 2 waited elsewhere, rank 1 here or elsewhere.
        words[_cpu_word(1)] = cpu if peer_here else cpu + 1000
        words[_cpu_word(2)] = cpu + 1000
        words[_cpu_word(0)] = cpu + 2000  # our own line (rank 0), which the wait overwrites: not company
        start = time.thread_time()
        assert _sync.wait_ranks(seg.address, 0, 3, 0, 1, 0, 10**9, 100_000_000, yield_company) == 1
        used = time.thread_time() - start
        assert used > 0.02 if yields else used < 0.01, used  # of a 0.1 s slice


def test_steps_wrap_around():
    with _fresh_segment("wrap") as (seg, _):
        _sync.post(seg.address, 1, 2, 0)  # 2**32 + 2 as seen through 32 bits
        assert _sync.wait_rank(seg.address, 1, 0xFFFFFFFF, 0, 0, 1000)
        assert not _sync.wait_rank(seg.address, 1, 3, 0, 0, 1000)


def test_process_alive():
    assert _sync.process_alive(os.getpid())
    proc = mp.get_context("fork").Process(target=time.sleep, args=(0,))
    proc.start()
    proc.join()
    assert not _sync.process_alive(proc.pid)
