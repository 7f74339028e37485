"""_ext/p2p.pyx alone: two ranks' ends of one channel over one buffer, in one process (the receiver on a thread).

Messages of every chunk count around the halves' payload arrive whole, in order, from C calls that wait for
the other side up to their slice; another message's header and an address chunk are reported, not copied."""
import threading

import numpy as np
import pytest

from shmcoll import _p2p

P2P_BYTES = 1024  # two halves of 512 bytes: 448 bytes of payload each
SLICE_NS = 2_000_000_000
LINE = 128


@pytest.fixture
def pair():
    """Rank 0's and rank 1's Channels over one arena's channel lines and data (2 local ranks)."""
    lines = np.zeros(4 * 2 * LINE // 8, dtype=np.int64)
    data = np.zeros(4 * P2P_BYTES // 8, dtype=np.int64)
    rank_lines = np.zeros(2 * LINE // 8, dtype=np.int64)
    ends = [_p2p.Channels(lines.ctypes.data, data.ctypes.data, P2P_BYTES, me, 2, rank_lines.ctypes.data)
            for me in (0, 1)]
    yield ends
    del lines, data, rank_lines


def _message(nbytes: int, seed: int) -> np.ndarray:
    return (np.arange(nbytes, dtype=np.int64) * 7 + seed).astype(np.uint8)


@pytest.mark.parametrize("nbytes", [0, 1, 447, 448, 449, 896, 897, 5 * 448 + 3])
def test_messages_arrive_whole_through_the_halves(pair, nbytes):
    sender, receiver = pair
    payload = sender.payload
    assert payload == P2P_BYTES // 2 - _p2p.HEADER_BYTES
    total = sender.chunks(nbytes)
    assert total == max(1, -(-nbytes // payload))
    for seed in range(3):  # three messages in a row: the counts go on from one to the next
        message = _message(nbytes, seed)
        got = np.zeros(max(nbytes, 1), dtype=np.uint8)
        taken = []
        thread = threading.Thread(target=lambda: taken.append(
            receiver.recv(0, got.ctypes.data, nbytes, 9, 0, SLICE_NS, 10_000, 0)))
        thread.start()
        # without a slice the sender posts what the two halves hold, then stops
        posted = sender.send(1, message.ctypes.data, nbytes, 9, 0, 0, 0, 0)
        assert 1 <= posted <= total
        posted = sender.send(1, message.ctypes.data, nbytes, 9, posted, SLICE_NS, 10_000, 0)
        thread.join()
        assert posted == total and taken == [total]
        assert np.array_equal(got[:nbytes], message)


def test_a_send_without_a_slice_stops_at_two_chunks_not_taken(pair):
    sender, _ = pair
    message = _message(4 * sender.payload, 1)
    assert sender.send(1, message.ctypes.data, message.nbytes, 0, 0, 0, 0, 0) == 2
    assert sender.send(1, message.ctypes.data, message.nbytes, 0, 2, 1_000_000, 0, 0) == 2  # the slice ends


def test_a_receive_waits_for_its_slice_and_keeps_what_came(pair):
    sender, receiver = pair
    got = np.zeros(16, dtype=np.uint8)
    assert receiver.recv(0, got.ctypes.data, 16, 0, 0, 1_000_000, 0, 0) == 0  # nothing came in 1 ms
    assert not receiver.ready(0)
    message = _message(16, 3)
    assert sender.send(1, message.ctypes.data, 16, 0, 0, 0, 0, 0) == 1
    assert receiver.ready(0)
    assert receiver.recv(0, got.ctypes.data, 16, 0, 0, 0, 0, 0) == 1
    assert np.array_equal(got, message)


def test_another_message_is_reported_not_copied(pair):
    sender, receiver = pair
    message = _message(32, 5)
    sender.send(1, message.ctypes.data, 32, 4, 0, 0, 0, 0)
    got = np.zeros(32, dtype=np.uint8)
    assert receiver.recv(0, got.ctypes.data, 32, 5, 0, 0, 0, 0) == _p2p.MISMATCH  # another tag
    assert receiver.recv(0, got.ctypes.data, 16, 4, 0, 0, 0, 0) == _p2p.MISMATCH  # another size
    assert receiver.next_header(0)[:4] == (4, 32, 0, 32)
    assert not got.any() and receiver.ready(0)  # nothing copied, nothing taken
    assert receiver.recv(0, got.ctypes.data, 32, 4, 0, 0, 0, 0) == 1


def test_an_address_chunk_is_left_to_the_caller(pair):
    sender, receiver = pair
    message = _message(4096, 7)
    read_by = sender.post_address(1, message.ctypes.data, 4096, 2)
    assert read_by == 1 and not sender.taken_by(1, read_by)
    got = np.zeros(4096, dtype=np.uint8)
    assert receiver.recv(0, got.ctypes.data, 4096, 2, 0, 0, 0, 0) == _p2p.DIRECT_CHUNK
    assert receiver.next_header(0) == (2, 4096, 0, _p2p.DIRECT, message.ctypes.data)
    receiver.take(0)
    assert sender.taken_by(1, read_by) and not receiver.ready(0)
