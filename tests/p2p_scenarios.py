"""Point-to-point transfers: send/recv, isend/irecv in both orders, batch_isend_irecv, any source, tags, many
in flight, object lists; the compiled path of a message that moves whole at once, and a receive completed by
whatever its caller asks of it."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from tests.references import assert_equal, assert_refused, make_data

# 3000001 float32 = 12 MB: far more than one channel (64 KiB by default, 4 KiB in the small config).
RING_COUNTS = (0, 1, 7, 1000, 100_003, 3_000_001)
RING_DTYPES = (torch.float32, torch.bfloat16, torch.int64)


def _self_send_refused(rank, world):
    try:
        dist.send(torch.zeros(1), 0)
    except (ValueError, RuntimeError) as error:
        assert "itself" in str(error) or "same as the rank" in str(error), error
    else:
        raise AssertionError("send to self did not raise")


def _ring(case, rank, world, dtype, count):
    """Each rank sends to the next and receives from the previous: batched, then irecv posted before isend."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out = make_data(case, rank, dtype, count)
    inp = torch.zeros(count, dtype=dtype)
    for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, inp, prv)]):
        q.wait()
    assert_equal(inp, make_data(case, prv, dtype, count), "batch_isend_irecv ring")
    back = torch.zeros(count, dtype=dtype)
    receiving = dist.irecv(back, prv)  # receive posted before the send, on every rank
    sending = dist.isend(out, nxt)
    receiving.wait()
    sending.wait()
    assert_equal(back, make_data(case, prv, dtype, count), "irecv before isend")


def _blocking_pairs(rank, world):
    if rank % 2 == 0 and rank + 1 < world:
        dist.send(make_data("bp", rank, torch.float32, 5000), rank + 1, tag=3)
        got = torch.zeros(17, dtype=torch.int64)
        dist.recv(got, rank + 1)
        assert_equal(got, make_data("bp2", rank + 1, torch.int64, 17), "recv reply")
    elif rank % 2 == 1:
        got = torch.zeros(5000)
        dist.recv(got, rank - 1, tag=3)
        assert_equal(got, make_data("bp", rank - 1, torch.float32, 5000), "recv")
        dist.send(make_data("bp2", rank, torch.int64, 17), rank - 1)


def _any_source(rank, world):
    if rank == 0:
        sources = []
        for _ in range(world - 1):
            t = torch.zeros(3)
            src = dist.recv(t)  # no src: any source, returns the sender
            assert t[0].item() == src, (t, src)
            sources.append(src)
        assert sorted(sources) == list(range(1, world)), sources
    else:
        dist.send(torch.full((3,), float(rank)), 0)


def _many_in_flight(rank, world):
    if rank == 0:
        works = [dist.isend(torch.full((777,), float(i)), 1, tag=9) for i in range(64)]
    elif rank == 1:
        bufs = [torch.zeros(777) for _ in range(64)]
        works = [dist.irecv(b, 0, tag=9) for b in bufs]
    else:
        works = []
    for w in works:
        w.wait()
    if rank == 1:
        for i, b in enumerate(bufs):
            assert_equal(b, torch.full((777,), float(i)), f"message {i}")


def _object_lists(rank, world):
    if rank == 0:
        dist.send_object_list([{"from": 0}, "two", 3], dst=1)
    elif rank == 1:
        objects = [None, None, None]
        dist.recv_object_list(objects, src=0)
        assert objects == [{"from": 0}, "two", 3], objects


def _compiled_path(rank, world):
    """A message that moves whole at once goes from the group's method to the channel in one compiled call
    (_p2p.SmallTransfers) on both sides, with the same Work; one that must wait goes the Python way."""
    small = dist.distributed_c10d._get_default_group()._small_transfers
    before = small.taken
    message = make_data("compiled", 0, torch.float32, 33)
    got = torch.zeros(33)
    work = None
    dist.all_reduce(torch.zeros(1))  # every earlier message received: the channel's halves are free
    if rank == 0:
        work = dist.isend(message, 1, tag=4)
    dist.all_reduce(torch.zeros(1))  # the message is in the channel before rank 1 receives it
    if rank == 1:
        work = dist.irecv(got, 0, tag=4)
    if work is not None:
        assert work.is_completed() and work.wait(), work
    if rank == 1:
        assert_equal(got, message, "a receive through the compiled path")
        assert work._source_rank() == 0, work._source_rank()
    assert small.taken == before + (rank < 2), (small.taken, before)
    if rank == 1:  # posted before its message: the Python way, which waits for it
        work = dist.irecv(got, 0, tag=6)
    dist.all_reduce(torch.zeros(1))
    if rank == 0:
        dist.send(message + 1, 1, tag=6)  # taken
    elif rank == 1:
        work.wait()
        assert_equal(got, message + 1, "a receive that waited")
    assert small.taken == before + 2 * (rank == 0) + (rank == 1), (small.taken, before)


def _receive_waited_otherwise(rank, world):
    """A small receive posted before its message waits in the channel for its caller's wait() without
    waking the p2p thread (p2p.TransferWork); asked anything else, it must still complete: polled with
    is_completed(), waited with a timeout, through its future."""
    from datetime import timedelta

    if rank > 1:
        return
    for way in ("polled", "timeout", "future"):
        if rank == 0:
            time.sleep(0.2)  # the receive is posted first
            dist.send(torch.full((3,), float(len(way))), 1, tag=5)
            continue
        got = torch.zeros(3)
        work = dist.irecv(got, 0, tag=5)
        deadline = time.monotonic() + 10
        if way == "polled":
            while not work.is_completed():
                assert time.monotonic() < deadline, "is_completed() never became true"
                time.sleep(0.001)
        elif way == "timeout":
            work.wait(timeout=timedelta(seconds=10))
        else:
            future = work.get_future()
            while not future.done():
                assert time.monotonic() < deadline, "the receive's future never completed"
                time.sleep(0.001)
        assert_equal(got, torch.full((3,), float(len(way))), f"a receive {way}")


def _wrong_tag_is_an_error(rank, world):
    if rank == 0:
        dist.send(torch.zeros(4), 1, tag=1)
    elif rank == 1:
        assert_refused(lambda: dist.recv(torch.zeros(4), 0, tag=2), RuntimeError, ("tag 2", "tag 1"),
                       "a receive for tag 2 of a message sent with tag 1")


# case name -> check(rank, world), in the order they run after the ring
PAIR_CASES = {
    "p2p/blocking_pairs": _blocking_pairs,
    "p2p/any_source": _any_source,
    "p2p/many_in_flight": _many_in_flight,
    "p2p/send_recv_object_list": _object_lists,
    "p2p/compiled_path": _compiled_path,
    "p2p/receive_waited_otherwise": _receive_waited_otherwise,
    # Last: it leaves the tag-1 message unreceived in the 0 -> 1 channel, on purpose.
    "p2p/wrong_tag": _wrong_tag_is_an_error,
}


def point_to_point(cases):
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        cases.run("p2p/self_send_refused", _self_send_refused, rank, world)
        return
    for count in RING_COUNTS:
        for dtype in RING_DTYPES:
            case = f"p2p/ring/{str(dtype)[6:]}/n={count}"
            cases.run(case, _ring, case, rank, world, dtype, count)
    cases.run_each(PAIR_CASES, rank, world)
    dist.barrier()


def point_to_point_cases(world: int) -> int:
    """How many cases ``point_to_point`` runs on each rank: alone, the refused send to itself."""
    if world == 1:
        return 1
    return len(RING_COUNTS) * len(RING_DTYPES) + len(PAIR_CASES)
