"""Soak: a long random sequence of collectives, each checked against a reference.

Every rank draws the same sequence (kind, dtype, size, root, group) from one
seed, so all call the same collective; inputs come from (operation, rank)
seeds, so each rank computes the expected result locally. RSS is sampled to
catch leaks. Run inside ranks by tests/worker.py; the long version is

    python -m tests.soak --ops 100000 --world-size 4
"""
from __future__ import annotations

import argparse
import random
import sys
import threading

import torch
import torch.distributed as dist

from tests.references import assert_equal, make_input, reference_reduce

KINDS = ["all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
         "reduce", "gather", "scatter", "barrier", "send_recv"]
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.float64]
OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


# A small chunk makes the random sizes cross chunk boundaries often. A fixed glibc mmap threshold
# makes every tensor over 64 KiB its own mapping, returned to the kernel when freed, so RSS tracks
# live memory: with glibc's default (a threshold that rises as large blocks are freed) RSS swings
# by tens of MiB with the sizes drawn, which would hide a leak or fake one.
SOAK_ENV = {"SHMCOLL_CHUNK_BYTES": "64K", "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4


def soak(cases, ops: str = "2000", seed: str = "1"):
    rank, world = dist.get_rank(), dist.get_world_size()
    total = int(ops)
    groups = [(None, list(range(world)))]
    if world >= 3:
        members = [0, world - 1, 1]  # any rank order
        groups.append((dist.new_group(members), sorted(members)))
    rng = random.Random(int(seed))
    rss = []
    mismatches = []
    for i in range(total):
        kind = rng.choice(KINDS)
        dtype = rng.choice(DTYPES)
        count = int(10 ** rng.uniform(0, 5.3)) if rng.random() < 0.9 else 0
        op_name = rng.choice(list(OPS))
        group, members = rng.choice(groups)
        root = rng.choice(members)
        if i % max(1, total // 10) == 0:
            rss.append(_rss_kib())
        if rank not in members:
            continue
        n = len(members)
        me = members.index(rank)
        tag = f"soak{seed}/{i}"
        try:
            _one(kind, dtype, count, op_name, group, members, root, rank, me, n, tag)
        except Exception as error:  # record and stop: ranks may now be out of step
            mismatches.append(f"op {i} {kind} {dtype} n={count} root={root} group={members}: {error}")
            break
    rss.append(_rss_kib())
    cases.check("soak", not mismatches, "; ".join(mismatches[:3]))
    # Baseline after the first 10% (allocator and caches warm), as the acceptance criterion reads.
    # Under SOAK_ENV the samples after it stay within a few hundred KiB; 4 MiB catches a leak of
    # about 3 KiB per operation (1350 operations) in the short CI run.
    first, last = rss[1] if len(rss) > 2 else rss[0], rss[-1]
    cases.check("soak/rss", last <= first + 4096, f"RSS grew from {first} KiB to {last} KiB: {rss}")
    return {"ops": total, "mismatches": len(mismatches), "rss_kib": rss}


def _one(kind, dtype, count, op_name, group, members, root, rank, me, n, tag):
    op = OPS[op_name]
    if kind == "all_reduce":
        inputs = [make_input(tag, r, dtype, count) for r in members]
        t = inputs[me].clone()
        dist.all_reduce(t, op=op, group=group)
        assert_equal(t, reference_reduce(inputs, op_name, dtype), kind)
    elif kind == "reduce":
        inputs = [make_input(tag, r, dtype, count) for r in members]
        t = inputs[me].clone()
        dist.reduce(t, dst=root, op=op, group=group)
        if rank == root:
            assert_equal(t, reference_reduce(inputs, op_name, dtype), kind)
    elif kind == "broadcast":
        expected = make_input(tag, root, dtype, count)
        t = expected.clone() if rank == root else torch.zeros(count, dtype=dtype)
        dist.broadcast(t, src=root, group=group)
        assert_equal(t, expected, kind)
    elif kind == "all_gather_into_tensor":
        out = torch.zeros(n * count, dtype=dtype)
        dist.all_gather_into_tensor(out, make_input(tag, rank, dtype, count), group=group)
        assert_equal(out, torch.cat([make_input(tag, r, dtype, count) for r in members]), kind)
    elif kind == "reduce_scatter_tensor":
        inputs = [make_input(tag, r, dtype, count * n) for r in members]
        out = torch.zeros(count, dtype=dtype)
        dist.reduce_scatter_tensor(out, inputs[me].clone(), op=op, group=group)
        assert_equal(out, reference_reduce(inputs, op_name, dtype)[me * count:(me + 1) * count], kind)
    elif kind == "all_to_all_single":
        inputs = [make_input(tag, r, dtype, count * n) for r in members]
        out = torch.zeros(count * n, dtype=dtype)
        dist.all_to_all_single(out, inputs[me], group=group)
        assert_equal(out, torch.cat([inputs[j][me * count:(me + 1) * count] for j in range(n)]), kind)
    elif kind == "gather":
        outs = [torch.zeros(count, dtype=dtype) for _ in members] if rank == root else None
        dist.gather(make_input(tag, rank, dtype, count), outs, dst=root, group=group)
        if rank == root:
            for j, r in enumerate(members):
                assert_equal(outs[j], make_input(tag, r, dtype, count), kind)
    elif kind == "scatter":
        out = torch.zeros(count, dtype=dtype)
        ins = [make_input(tag, r, dtype, count) for r in members] if rank == root else None
        dist.scatter(out, ins, src=root, group=group)
        assert_equal(out, make_input(tag, rank, dtype, count), kind)
    elif kind == "barrier":
        dist.barrier(group=group)
    elif kind == "send_recv" and n > 1:
        nxt, prv = members[(me + 1) % n], members[(me - 1) % n]
        got = torch.zeros(count, dtype=dtype)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, make_input(tag, rank, dtype, count), nxt, group),
                                        dist.P2POp(dist.irecv, got, prv, group)])
        for w in works:
            w.wait()
        assert_equal(got, make_input(tag, prv, dtype, count), kind)


def two_threads(cases):
    """Two threads issue collectives on two different groups at the same time."""
    rank, world = dist.get_rank(), dist.get_world_size()
    first, second = dist.new_group(), dist.new_group()
    errors = []

    def loop(group, tag):
        try:
            for i in range(300):
                count = (i * 7919) % 5000
                inputs = [make_input(f"{tag}/{i}", r, torch.float32, count) for r in range(world)]
                t = inputs[rank].clone()
                dist.all_reduce(t, group=group)
                assert_equal(t, reference_reduce(inputs, "sum", torch.float32), f"{tag} #{i}")
        except Exception as error:
            errors.append(f"{tag}: {error}")

    threads = [threading.Thread(target=loop, args=(g, t)) for g, t in ((first, "a"), (second, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    cases.check("threads/two_groups", not errors and not any(t.is_alive() for t in threads), "; ".join(errors))


def main() -> int:
    from tests.harness import assert_job_passes, shm_entries, spawn

    parser = argparse.ArgumentParser(description="long soak of the shm backend")
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    before = shm_entries()
    result = spawn("tests.soak:soak", args.world_size, timeout=24 * 3600, args=[str(args.ops), str(args.seed)],
                   env=SOAK_ENV)
    for rank, report in enumerate(result.reports):
        if report:
            rss = report["rss_kib"]
            print(f"rank {rank}: {report['ops']} ops, {report['mismatches']} mismatches, RSS {rss[0]} KiB at start, "
                  f"{rss[1]} KiB at 10%, {rss[-1]} KiB at the end ({(rss[-1] / rss[1] - 1) * 100:+.1f}%)")
    assert_job_passes(result, min_cases=2)
    assert shm_entries() - before == set()
    print("soak passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
