"""What the sweeps print and write: tables, the machine description, the JSON document.

Rank 0 prints Markdown tables row by row as points complete, so that a long sweep shows
progress and an interrupted one still leaves its numbers on screen.  The JSON document
(``--json``) holds the machine, the configuration, the memcpy ceiling and one row per
(op, dtype, bytes) with ``results[label]`` per backend; shmcoll_bench.mpi writes the same
layout, so that shmcoll_bench.results can merge the two and shmcoll_bench.plot draw them.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import statistics

# The ops' names in tables.
SHORT_OP = {
    "all_reduce": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "broadcast": "broadcast",
}

# How the numbers of a document are defined, recorded in its config.
CONVENTIONS = {
    "size_convention": "nccl-tests: all_gather bytes = output, reduce_scatter bytes = input",
    "latency": "median over rounds of max over ranks of per-call time",
}


def fmt_bytes(n: int) -> str:
    """Exact: '64 MiB', '1.5 KiB', or plain bytes ('1048572 B') when no unit divides evenly."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and (n * 4) % scale == 0:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:g} {unit}"
    return f"{n} B"


def fmt_us(sec: float | None) -> str:
    if sec is None:
        return "n/a"
    us = sec * 1e6
    if us >= 100:
        return f"{us:.0f}"
    if us >= 10:
        return f"{us:.1f}"
    return f"{us:.2f}"


def fmt_gbps(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.2f}"
    if v >= 0.01:
        return f"{v:.3f}"
    return f"{v:.1e}" if v > 0 else "0"


def dtype_name(dt) -> str:
    """'float32' for torch.float32."""
    return str(dt).replace("torch.", "")


class Table:
    """Fixed-width Markdown table, printed row by row (rank 0 only)."""

    def __init__(self, headers, widths, out):
        self.widths = [max(w, len(h)) for h, w in zip(headers, widths)]
        self.out = out
        self._row(headers)
        self.out.write("|" + "|".join("-" * (w + 1) + ":" if i > 1 else ":" + "-" * (w + 1)
                                      for i, w in enumerate(self.widths)) + "|\n")
        self.out.flush()

    def _row(self, cells):
        parts = []
        for i, (c, w) in enumerate(zip(cells, self.widths)):
            parts.append(f" {c:<{w}} " if i <= 1 else f" {c:>{w}} ")
        self.out.write("|" + "|".join(parts) + "|\n")

    def row(self, cells):
        self._row(cells)
        self.out.flush()


def _dtype_width(dtypes) -> int:
    return max([8] + [len(dtype_name(d)) for d in dtypes])


def point_table(labels: list[str], dtypes, out) -> Table:
    """The table of one op: a row per point (``point_cells``) with every backend's latency,
    algbw and busbw, and the latency of every other backend relative to the first."""
    nb = len(labels)
    headers = ["op", "dtype", "bytes"]
    headers += [f"{lb} us" for lb in labels]
    headers += [f"{lb} algbw GB/s" for lb in labels]
    headers += [f"{lb} busbw GB/s" for lb in labels]
    headers += [f"{lb}/{labels[0]} x" for lb in labels[1:]]
    return Table(headers, [14, _dtype_width(dtypes), 9] + [9] * nb + [6] * (2 * nb) + [6] * (nb - 1), out)


def point_cells(row: dict, labels: list[str]) -> list[str]:
    """The cells of ``point_table`` for one row of the document."""
    res = row["results"]
    lat = [res[lb].get("lat_us") for lb in labels]
    cells = [SHORT_OP[row["op"]], row["dtype"], fmt_bytes(row["bytes"])]
    cells += [fmt_us(None if v is None else v / 1e6) for v in lat]
    cells += [fmt_gbps(res[lb].get("algbw_gbps")) for lb in labels]
    cells += [fmt_gbps(res[lb].get("busbw_gbps")) for lb in labels]
    cells += ["n/a" if v is None else f"{v:.2f}" for v in row["ratio"].values()]
    return cells


def measured(nbytes: int, rounds_s: list, busbw_factor: float, iters: int) -> dict:
    """One backend's result at one point, from its rounds (each the slowest rank's time per
    call): latency is their median, the minimum and every round are kept."""
    lat = statistics.median(rounds_s)
    algbw = nbytes / lat / 1e9
    return {"status": "ok", "lat_us": lat * 1e6, "min_us": min(rounds_s) * 1e6,
            "algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor, "iters": iters,
            "rounds_us": [v * 1e6 for v in rounds_s]}


def machine_info(world: int) -> dict:
    """The machine and software the numbers come from (``machine`` of the document)."""
    import torch  # here, so that shmcoll_bench.results and plot read documents without torch

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gib = int(line.split()[1]) / (1 << 20)
                    break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {
        "cpu_model": cpu,
        "logical_cpus": os.cpu_count(),
        "cpus_in_affinity": affinity,
        "memory_gib": round(mem_gib, 1) if mem_gib else None,
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "world_size": world,
        "torch_threads_per_rank": torch.get_num_threads(),
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def pinning(args) -> str:
    """The method line's words on ``--pin`` (shmcoll_bench.timing.pin)."""
    return ("; local rank r of n bound to the r-th of n shares of the CPUs (CPU r mod (CPUs) where ranks "
            "outnumber them)") if args.pin else ""


def write_header(out, machine: dict, labels: list[str], args, memcpy: list, memcpy_gbps: float) -> None:
    """The torch sweep's preamble: machine, backends, method and the memcpy ceiling."""
    m, world = machine, machine["world_size"]
    out.write("# shmcoll sweep\n\n")
    out.write(f"- date: {m['date']}, host {m['hostname']}, kernel {m['kernel']}\n")
    out.write(f"- CPU: {m['cpu_model']}, {m['logical_cpus']} logical CPUs "
              f"({m['cpus_in_affinity']} in affinity mask), memory {m['memory_gib']} GiB\n")
    out.write(f"- torch {m['torch']}, Python {m['python']}, world size {world}, "
              f"{m['torch_threads_per_rank']} torch thread per rank\n")
    out.write(f"- backends: {labels[0]} (default group)"
              + "".join(f", {lb} (new_group)" for lb in labels[1:])
              + "; bookkeeping on a separate gloo group\n")
    out.write(f"- method: {args.rounds} interleaved rounds per backend of ~{args.iters_time:g} s; "
              f"latency = median over rounds of the slowest rank's time per call; "
              f"bytes = nccl-tests size (all_gather: output, reduce_scatter: input){pinning(args)}\n")
    out.write(f"- memcpy ceiling (torch copy_, {args.threads} thread(s), {fmt_bytes(args.memcpy_bytes)}, "
              f"all {world} ranks at once): {memcpy_gbps:.2f} GB/s per rank, mean "
              f"(ranks: {', '.join(f'{v:.2f}' for v in memcpy)}; sum {sum(memcpy):.2f})\n\n")
    out.flush()


def largest_vs_memcpy(rows: list[dict], ops, dtypes, labels: list[str], memcpy_gbps: float) -> list[dict]:
    """busbw at the largest size of each (op, dtype), and its share of the memcpy ceiling."""
    summary = []
    for op in ops:
        for dt in dtypes:
            cand = [r for r in rows if r["op"] == op and r["dtype"] == dtype_name(dt)]
            if not cand:
                continue
            big = max(cand, key=lambda r: r["bytes"])
            ent = {"op": op, "dtype": big["dtype"], "bytes": big["bytes"], "busbw_gbps": {},
                   "pct_of_memcpy": {}}
            for lb in labels:
                v = big["results"][lb].get("busbw_gbps")
                ent["busbw_gbps"][lb] = v
                ent["pct_of_memcpy"][lb] = (100.0 * v / memcpy_gbps) if v is not None else None
            summary.append(ent)
    return summary


def write_summary(out, summary: list[dict], labels: list[str], dtypes, memcpy_gbps: float) -> None:
    """The table of ``largest_vs_memcpy``."""
    out.write(f"## busbw at the largest size vs memcpy ceiling ({memcpy_gbps:.2f} GB/s per rank)\n\n")
    headers = ["op", "dtype", "bytes"] + [f"{lb} busbw GB/s" for lb in labels] + \
              [f"{lb} % memcpy" for lb in labels]
    table = Table(headers, [14, _dtype_width(dtypes), 9] + [6] * (2 * len(labels)), out)
    for ent in summary:
        table.row([SHORT_OP[ent["op"]], ent["dtype"], fmt_bytes(ent["bytes"])]
                  + [fmt_gbps(ent["busbw_gbps"][lb]) for lb in labels]
                  + ["n/a" if ent["pct_of_memcpy"][lb] is None else f"{ent['pct_of_memcpy'][lb]:.0f}%"
                     for lb in labels])


def document(args, machine: dict, labels: list[str], reference: str, memcpy: list, memcpy_gbps: float,
             rows: list[dict], summary: list[dict], elapsed: float) -> dict:
    """The torch sweep's JSON document."""
    return {
        "machine": machine,
        "config": {
            "backends": labels, "backend_names": args.backend_names,
            "default_backend": args.backend_names[0], "reference_backend": reference,
            "ops": args.op_list, "dtypes": [dtype_name(d) for d in args.dtype_list],
            "sizes": args.sizes, "iters_time_s": args.iters_time, "rounds": args.rounds,
            "warmup": args.warmup, "quick": args.quick, "checked": not args.no_check, "pinned": args.pin,
            **CONVENTIONS,
        },
        "memcpy_gbps": memcpy_gbps,
        "memcpy_gbps_per_rank": memcpy,
        "memcpy_gbps_sum": sum(memcpy),
        "memcpy_method": f"torch copy_ of a uint8 buffer, {args.threads} thread(s), all ranks at once; "
                         "GB/s = bytes copied / s (1e9); memcpy_gbps = mean over ranks",
        "memcpy_bytes": args.memcpy_bytes,
        "rows": rows,
        "largest_size_busbw_vs_memcpy": summary,
        "elapsed_s": elapsed,
    }
