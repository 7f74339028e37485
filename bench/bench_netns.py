"""shm against Gloo between two real "nodes": two network namespaces joined by a shaped veth pair.

    python bench/bench_netns.py [--per-node 2] [--rates 1gbit,unshaped] [--sizes 8,4K,64K,1M,16M]
        [--ops all_reduce,broadcast,...,barrier,send_recv] [--rounds 5] [--json results/netns.json]
        [--timeout 1800] [--quick]

Needs root (tests/netns.py). For each rate, in turn: make the pair, shape both veth ends with tbf
(tests.netns.shape; "unshaped": none), and start one torchrun per namespace with its own
SHMCOLL_HOSTID and GLOO_SOCKET_IFNAME, so everything between the nodes crosses the shaped link.
The pair is removed and every process of ours killed whatever happens (an error, the global
--timeout, SIGINT, SIGTERM).

Method. Each rank has the default group (shm), a Gloo group over the same ranks, and a second
Gloo group, "control", for the bookkeeping, so the timed loops hold only the collective. For
each (op, size) both backends first run the op on the same random float32 inputs and shm's
result must be Gloo's (bitwise for data movement, allclose for reductions), else the run stops.
Timing uses zero-filled buffers, so in-place sums stay finite over any number of calls. The
calls per round, k, are calibrated once per (op, size, backend) to ~0.3 s (at least 1). Rounds
alternate shm, gloo, gloo, shm, shm, gloo, ... (--rounds each: each backend first in every other pair); a round is a warm-up call, a control barrier and
k calls under perf_counter; its time is the slowest rank's mean per call, and a point's time the
median of its rounds. send_recv: local rank i of node 0 sends to local rank i of node 1, which
sends back; a "call" is one message (half a round trip). Rank 0 reads its veth end's byte
counters around every timed loop; "B/call" is node 0's busier direction (tx, or rx where the data
flows towards it, as in gather) per call.

Sizes follow nccl-tests: the tensor (all_reduce, broadcast, reduce, send_recv's message), the
output (all_gather_into_tensor, all_gather), the input (reduce_scatter_tensor, and per rank for
all_to_all, all_to_all_single), the root's whole buffer (gather, scatter). Per-rank parts are
rounded down to whole float32 elements, but at least one; the actual bytes are reported.

Link bound: the bytes the best plan must move across the link in each direction, over the link
rate (tc units: 1gbit = 125e6 B/s). For size S: S for all_reduce, broadcast, reduce,
all_to_all_single, all_to_all; S/2 for all_gather_into_tensor, all_gather,
reduce_scatter_tensor, gather and scatter (the half of the root's buffer on the other node);
for send_recv, per message, max(S, per_node x S / 2): a round trip moves per_node messages each
way and both directions run at once, but a pair's reply waits for its message (S at 2 per node).
"shm %" is bound / shm time.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Callable, NamedTuple

from shmcoll._env import parse_bytes

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.netns, when run as a script

OPS = ("all_reduce,broadcast,reduce,all_gather_into_tensor,reduce_scatter_tensor,all_to_all_single,"
       "all_gather,gather,scatter,all_to_all,barrier,send_recv")
REDUCTIONS = {"all_reduce", "reduce", "reduce_scatter_tensor"}
ROUND_S = 0.3
MARKER = "BENCH_NETNS_PARENT"  # in every process we start, so cleanup finds orphaned ranks by id
BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}



def link_bytes_per_s(rate: str) -> float | None:
    if rate == "unshaped":
        return None
    number, unit = re.fullmatch(r"([\d.]+)([a-z]+)", rate.lower()).groups()
    return float(number) * BITS[unit] / 8


class Case(NamedTuple):
    nbytes: int                   # the size as reported (whole elements)
    bound_bytes: int              # across the link per direction, for the best plan
    run: Callable                 # run(group): one call
    output: Callable              # this rank's result to compare, None where it has none


def build(op: str, size: int, rank: int, world: int, per_node: int, fill) -> Case:
    import torch
    import torch.distributed as dist
    from shmcoll_bench.cases import ALL_GATHER, REDUCE_SCATTER

    n, p = max(1, size // 4), max(1, size // 4 // world)
    whole, parts, root = 4 * n, 4 * p * world, rank == 0
    if op == "barrier":
        return Case(0, 0, lambda g: dist.barrier(group=g), lambda: None)
    if op in ("all_reduce", "broadcast", "reduce"):
        t = fill(n)
        run = {"all_reduce": lambda g: dist.all_reduce(t, group=g), "broadcast": lambda g: dist.broadcast(t, 0, group=g),
               "reduce": lambda g: dist.reduce(t, 0, group=g)}[op]
        return Case(whole, whole, run, lambda: t if op != "reduce" or root else None)
    if op == "send_recv":
        peer, out, t = (rank + per_node) % world, torch.zeros(n), fill(n)

        def run(g):
            if rank < per_node:
                dist.send(t, peer, group=g)
                dist.recv(out, peer, group=g)
            else:
                dist.recv(out, peer, group=g)
                dist.send(t, peer, group=g)
        # Per message (half a round trip): each direction carries per_node messages per round trip
        # while the other carries the replies; one pair's reply waits for its message.
        return Case(whole, max(whole, per_node * whole // 2), run, lambda: out)
    if op == "all_gather_into_tensor":
        inp, out = fill(p), torch.zeros(p * world)
        return Case(parts, parts // 2, lambda g: ALL_GATHER(out, inp, group=g), lambda: out)
    if op == "reduce_scatter_tensor":
        inp, out = fill(p * world), torch.zeros(p)
        return Case(parts, parts // 2, lambda g: REDUCE_SCATTER(out, inp, group=g), lambda: out)
    if op == "all_to_all_single":
        inp, out = fill(p * world), torch.zeros(p * world)
        return Case(parts, parts, lambda g: dist.all_to_all_single(out, inp, group=g), lambda: out)
    if op == "all_to_all":
        ins, outs = list(fill(p * world).split(p)), [torch.zeros(p) for _ in range(world)]
        return Case(parts, parts, lambda g: dist.all_to_all(outs, ins, group=g), lambda: torch.cat(outs))
    if op == "all_gather":
        inp, outs = fill(p), [torch.zeros(p) for _ in range(world)]
        return Case(parts, parts // 2, lambda g: dist.all_gather(outs, inp, group=g), lambda: torch.cat(outs))
    if op == "gather":
        inp, outs = fill(p), [torch.zeros(p) for _ in range(world)] if root else None
        return Case(parts, parts // 2, lambda g: dist.gather(inp, outs, dst=0, group=g),
                    lambda: torch.cat(outs) if root else None)
    if op == "scatter":
        ins, out = list(fill(p * world).split(p)) if root else None, torch.zeros(p)
        return Case(parts, parts // 2, lambda g: dist.scatter(out, ins, src=0, group=g), lambda: out)
    raise ValueError(f"unknown op {op!r}")


def worker(args) -> None:
    """One rank: check, then time, every (op, size); rank 0 keeps the report in args.out after each point."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor's, once per rank
    timeout = timedelta(seconds=300)
    dist.init_process_group("shm", timeout=timeout)
    rank, world, per_node = dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_WORLD_SIZE"])
    groups = {"shm": dist.group.WORLD, "gloo": dist.new_group(backend="gloo", timeout=timeout)}
    control = dist.new_group(backend="gloo", timeout=timeout)
    stats = f"/sys/class/net/{os.environ['GLOO_SOCKET_IFNAME']}/statistics"  # this namespace's veth end
    report = {"world": world, "per_node": per_node, "points": [], "stopped": None}

    def agree(value: float, op=dist.ReduceOp.MAX) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=op, group=control)
        return t.item()

    def first(text: str) -> str:
        """The first rank's non-empty text, on every rank."""
        texts = [None] * world
        dist.all_gather_object(texts, text, group=control)
        return next((t for t in texts if t), "")

    def counters() -> tuple[int, int]:
        if rank != 0:
            return 0, 0
        return tuple(int(Path(f"{stats}/{name}").read_text()) for name in ("tx_bytes", "rx_bytes"))

    def save() -> None:
        if rank == 0:
            Path(args.out + ".tmp").write_text(json.dumps(report))
            os.replace(args.out + ".tmp", args.out)

    def random_fill():
        gen = torch.Generator().manual_seed(rank)  # a fresh one per backend: both get the same inputs
        return lambda n: torch.randn(n, generator=gen)

    def check(op: str, size: int) -> tuple[dict, str]:
        """Each backend's error (first rank's text), and how shm's result differs from Gloo's ('' if not)."""
        results, errors = {}, {}
        for name, group in groups.items():
            case = build(op, size, rank, world, per_node, random_fill())
            try:
                case.run(group)
                results[name] = case.output()
            except Exception as exc:
                results[name] = None
                errors[name] = f"rank {rank}: {type(exc).__name__}: {exc}"
        errors = {name: text for name in groups if (text := first(errors.get(name, "")))}
        a, b, diff = results["shm"], results["gloo"], ""
        if not errors and a is not None:
            same = torch.allclose(a, b, rtol=1e-5, atol=1e-5) if op in REDUCTIONS else torch.equal(a, b)
            if not same:
                diff = f"rank {rank}: max |shm - gloo| = {(a - b).abs().max().item():.3g} over {a.numel()} elements"
        return errors, first(diff)

    def calibrate(run, group) -> int:
        n = 1
        while True:
            dist.barrier(group=control)
            start = time.perf_counter()
            for _ in range(n):
                run(group)
            elapsed = agree(time.perf_counter() - start)
            if elapsed >= 0.05:
                return max(1, round(ROUND_S * n / elapsed))
            n *= 4

    ops = args.ops.split(",")
    points = [(op, size) for op in ops for size in ([0] if op == "barrier" else map(parse_bytes, args.sizes.split(",")))]
    for op, size in points:
        errors, diff = check(op, size)
        if diff:
            report["stopped"] = f"{op} at {size} B: shm's result is not Gloo's ({diff})"
            break
        # A failed collective may leave its group unusable on every rank: go on only if it still works.
        broken = ""
        for name in errors:
            try:
                dist.barrier(group=groups[name])
                works = 1.0
            except Exception:
                works = 0.0
            if agree(works, dist.ReduceOp.MIN) < 1:
                broken = f"{name} group unusable after {op} at {size} B failed: {errors[name]}"
        timed = [name for name in groups if name not in errors]
        cases = {name: build(op, size, rank, world, per_node, torch.zeros) for name in groups}
        point = {"op": op, "requested_bytes": size, "bytes": cases["shm"].nbytes,
                 "bound_bytes": cases["shm"].bound_bytes, **{name: {"error": errors[name]} for name in errors}}
        if broken:
            report["points"].append(point)
            report["stopped"] = broken
            break
        per_message = 2 if op == "send_recv" else 1  # a loop's send_recv is a round trip: two messages
        calls = {name: calibrate(cases[name].run, groups[name]) for name in timed}
        rounds = {name: [] for name in timed}
        for turn in range(args.rounds):
            # Each backend goes first in every other round: neither always runs on the connections, caches
            # and scheduler state the other just left.
            for name in (timed if turn % 2 == 0 else timed[::-1]):
                run, group = cases[name].run, groups[name]
                run(group)
                dist.barrier(group=control)
                tx, rx = counters()
                start = time.perf_counter()
                for _ in range(calls[name]):
                    run(group)
                seconds = (time.perf_counter() - start) / calls[name]
                tx2, rx2 = counters()
                rounds[name].append({"s": agree(seconds) / per_message, "calls": calls[name] * per_message,
                                     "tx": [tx, tx2], "rx": [rx, rx2]})
        for name in timed:
            done = sum(r["calls"] for r in rounds[name])
            point[name] = {"median_s": statistics.median(r["s"] for r in rounds[name]), "rounds": rounds[name],
                           "tx_per_call": sum(r["tx"][1] - r["tx"][0] for r in rounds[name]) / done,
                           "rx_per_call": sum(r["rx"][1] - r["rx"][0] for r in rounds[name]) / done}
        report["points"].append(point)
        save()
        if rank == 0:
            print(f"  {op} {human_bytes(point['bytes'])}: " + ", ".join(
                f"{name} {cell(point, name)}" for name in groups), file=sys.stderr, flush=True)
    save()
    dist.barrier(group=control)  # torchrun stops a node's ranks once one fails: let rank 0 save first
    if report["stopped"]:
        if rank == 0:
            print(f"stopped: {report['stopped']}", file=sys.stderr, flush=True)
        sys.exit(1)
    dist.destroy_process_group()


def human_bytes(n: float) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale:.0f} {unit}"
    return f"{n:.0f} B"


def human_time(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def cell(point: dict, name: str) -> str:
    if name not in point:
        return "-"
    return f"error: {point[name]['error'][:70]}" if "error" in point[name] else human_time(point[name]["median_s"])


def table(run: dict, machine: dict) -> str:
    rate = link_bytes_per_s(run["rate"])
    lines = [f"{machine['cpu']}, {machine['cores']} cores, Linux {machine['kernel']}, torch {machine['torch']}; "
             f"link {run['rate']}{' (tbf on both veth ends)' if rate else ''}, TCP {machine.get('tcp', '?')}, "
             f"2 nodes x {run['per_node']} ranks; "
             f"commit {machine['commit']}", "",
             "| op | size | shm | gloo | gloo/shm | bound | shm % | gloo % | shm B/call | gloo B/call |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in run["points"]:
        ok = {name: "median_s" in p.get(name, {}) for name in ("shm", "gloo")}
        bound = p["bound_bytes"] / rate if rate and p["bound_bytes"] else None
        share = {name: f"{100 * bound / p[name]['median_s']:.0f}%" if bound and ok[name] else "-" for name in ok}
        sent = {name: f"{max(p[name]['tx_per_call'], p[name]['rx_per_call']):,.0f}" if ok[name] else "-" for name in ok}
        ratio = f"{p['gloo']['median_s'] / p['shm']['median_s']:.2f}" if all(ok.values()) else "-"
        lines.append(f"| {p['op']} | {human_bytes(p['bytes'])} | {cell(p, 'shm')} | {cell(p, 'gloo')} | {ratio} | "
                     f"{human_time(bound) if bound else '-'} | {share['shm']} | {share['gloo']} | "
                     f"{sent['shm']} | {sent['gloo']} |")
    if run.get("error"):
        lines.append(f"\n**stopped**: {run['error']}")
    return "\n".join(lines)


def describe() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()
    from importlib.metadata import version
    # New namespaces take the machine's TCP congestion control, which decides how a connection that has
    # carried bulk data sends a burst afterwards (BBR paces it at the rate it learnt; BENCHMARKS.md).
    congestion = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    # Others may be editing the tree: say so, the commit alone would not describe what ran.
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(), "torch": version("torch"),
            "tcp": congestion,
            "commit": git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain", "src") else "")}


def ours() -> list[int]:
    """Pids of the processes we started (torchrun and its ranks, which run in sessions of their own)."""
    tag, pids = f"{MARKER}={os.getpid()}".encode(), []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and tag in open(f"/proc/{entry}/environ", "rb").read().split(b"\0"):
                pids.append(int(entry))
        except OSError:  # gone meanwhile
            pass
    return pids


def stop(procs: list) -> None:
    """SIGTERM each torchrun's group (torchrun passes it on to its ranks), then SIGKILL whatever of ours is left."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    end = time.monotonic() + 20
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for pid in ours():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for proc in procs:
        proc.wait()


def run_rate(rate: str, args, deadline: float) -> dict:
    from tests.netns import make_pair, remove_pair, shape

    pair, procs, tmp = make_pair(), [], tempfile.mkdtemp(prefix="bench-netns-")
    try:
        shape(pair, rate)
        out, before = os.path.join(tmp, "result.json"), [pair.counters(node) for node in range(2)]
        for node in range(2):
            env = {**os.environ, "SHMCOLL_HOSTID": f"netns-node{node}", "GLOO_SOCKET_IFNAME": pair.interfaces[node],
                   "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                   os.environ.get("PYTHONPATH")])), MARKER: str(os.getpid())}
            cmd = [*pair.exec_prefix(node), sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--nproc-per-node", str(args.per_node), "--node-rank", str(node), "--master-addr",
                   pair.addresses[0], "--master-port", "29500", __file__, "--rank-worker", "--ops", args.ops,
                   "--sizes", args.sizes, "--rounds", str(args.rounds), "--out", out]
            # Node 0's output (rank 0's progress) goes to our stderr; node 1's to a log shown on failure.
            log = sys.stderr if node == 0 else open(os.path.join(tmp, "node1.log"), "w")
            procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        error, failed_at = None, None
        while any(proc.poll() is None for proc in procs):
            codes = [proc.poll() for proc in procs]
            if failed_at is None and any(code not in (None, 0) for code in codes):
                failed_at = time.monotonic()  # the other node may wait on the dead one until its timeout
            if failed_at is not None and time.monotonic() > failed_at + 15:
                break
            if time.monotonic() > deadline:
                error = f"the global --timeout ({args.timeout} s) ran out"
                break
            time.sleep(0.2)
        codes = [proc.poll() for proc in procs]
        run = json.loads(Path(out).read_text()) if os.path.exists(out) else {"points": [], "stopped": None}
        if error is None and codes != [0, 0]:
            tail = Path(tmp, "node1.log").read_text().splitlines()[-15:]
            error = run["stopped"] or f"torchrun exit codes {codes}; node 1's log ends:\n" + "\n".join(tail)
        after = [pair.counters(node) for node in range(2)]
        return {**run, "rate": rate, "per_node": args.per_node, "link_bytes_per_s": link_bytes_per_s(rate),
                "error": error, "veth_counters": {"before": before, "after": after}}
    finally:
        # Block the signals that end us, so that a second Ctrl-C cannot cut the cleanup short.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
        try:
            stop(procs)
            remove_pair(pair)
            shutil.rmtree(tmp, ignore_errors=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def interrupted(signum, frame):
    raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-node", type=int, default=2)
    parser.add_argument("--rates", default="1gbit,unshaped")
    parser.add_argument("--sizes", default="8,4K,64K,1M,16M")
    parser.add_argument("--ops", default=OPS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="results/netns.json")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for the whole run")
    parser.add_argument("--quick", action="store_true", help="sizes 8,64K,1M; 3 rounds; 1gbit only")
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_worker:
        return worker(args)
    if set(args.ops.split(",")) - set(OPS.split(",")):
        parser.error(f"unknown ops {set(args.ops.split(',')) - set(OPS.split(','))}; known: {OPS}")
    if args.quick:
        args.sizes, args.rounds, args.rates = "8,64K,1M", 3, "1gbit"
    # Explicit handlers: a shell starts background jobs with SIGINT ignored, and SIGTERM's default
    # would skip the finally that removes the namespaces.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupted)
    machine, deadline = describe(), time.monotonic() + args.timeout
    result = {"command": sys.argv, "machine": machine, "runs": []}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    for rate in args.rates.split(","):
        if time.monotonic() > deadline:
            print(f"\nrate {rate}: skipped, the global --timeout ran out", flush=True)
            continue
        print(f"rate {rate}: {args.ops}", file=sys.stderr, flush=True)
        run = run_rate(rate, args, deadline)
        result["runs"].append(run)
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"\n{table(run, machine)}\n", flush=True)
    print(f"raw numbers: {args.json}")
    sys.exit(1 if any(run["error"] for run in result["runs"]) else 0)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted")
