"""Sweep result documents: load, merge and print them (no matplotlib).

shmcoll_bench.sweep (torch backends, under torchrun) and shmcoll_bench.mpi (MPI, under mpirun) run
as separate jobs but write the same JSON layout: ``config.backends`` (labels) and ``rows``,
one per (op, dtype, bytes), each with ``results[label]`` (``status``, ``lat_us``,
``algbw_gbps``, ``busbw_gbps``, ...).  ``merge`` joins such documents on (op, dtype, bytes) so
that one table and one plot show every backend; it is kept apart from the plot so that
``python -m shmcoll_bench`` can write the merged JSON where matplotlib is not installed.
"""
from __future__ import annotations

import copy
import json
import os

from shmcoll_bench.report import SHORT_OP, fmt_bytes, fmt_us


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def save(doc: dict, path: str) -> None:
    """Writes atomically, so an interrupted run never leaves half a file behind."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def _ok(result: dict | None) -> bool:
    return bool(result) and result.get("status") == "ok"


def merge(docs: list[dict]) -> dict:
    """One document with the rows and backends of all of ``docs``.

    The first document that measured the memcpy ceiling (the torch sweep) is the base: its
    machine, config and memcpy figures are kept, and its first backend stays the one that
    ratios are taken against.  The others are recorded under ``sources``.  Two documents that
    both carry results for the same backend label are an error (which one would be right?).
    """
    if not docs:
        raise ValueError("nothing to merge")
    base_doc = next((d for d in docs if d.get("memcpy_gbps")), docs[0])
    merged = copy.deepcopy(base_doc)
    labels = list(merged["config"]["backends"])
    rows = {(r["op"], r["dtype"], r["bytes"]): r for r in merged["rows"]}
    merged["sources"] = [_source(base_doc)]
    for doc in docs:
        if doc is base_doc:
            continue
        merged["sources"].append(_source(doc))
        for label in doc["config"]["backends"]:
            if label in labels:
                raise ValueError(f"backend {label!r} appears in more than one document")
            labels.append(label)
        for row in doc["rows"]:
            key = (row["op"], row["dtype"], row["bytes"])
            if key in rows:
                rows[key]["results"].update(copy.deepcopy(row["results"]))
            else:
                rows[key] = copy.deepcopy(row)
                merged["rows"].append(rows[key])
    merged["config"]["backends"] = labels
    base = labels[0]
    for row in merged["rows"]:
        lat = {lb: row["results"][lb]["lat_us"] for lb in labels if _ok(row["results"].get(lb))}
        row["ratio"] = {f"{lb}/{base}": (lat[lb] / lat[base] if lb in lat and base in lat else None)
                        for lb in labels[1:]}
    merged["largest_size_busbw_vs_memcpy"] = _largest_vs_memcpy(merged, labels)
    return merged


def _source(doc: dict) -> dict:
    """What identifies one run inside a merged document."""
    keep = ("machine", "config", "elapsed_s", "mpi")
    return {key: doc[key] for key in keep if key in doc}


def _largest_vs_memcpy(doc: dict, labels: list[str]) -> list[dict]:
    """busbw at the largest size of each (op, dtype), and its share of the memcpy ceiling."""
    memcpy = doc.get("memcpy_gbps")
    largest = {}
    for row in doc["rows"]:
        key = (row["op"], row["dtype"])
        if key not in largest or row["bytes"] > largest[key]["bytes"]:
            largest[key] = row
    summary = []
    for (op, dtype), row in largest.items():
        busbw = {lb: row["results"][lb]["busbw_gbps"] if _ok(row["results"].get(lb)) else None
                 for lb in labels}
        summary.append({"op": op, "dtype": dtype, "bytes": row["bytes"], "busbw_gbps": busbw,
                        "pct_of_memcpy": {lb: (100.0 * v / memcpy if v is not None and memcpy else None)
                                          for lb, v in busbw.items()}})
    return summary


def print_comparison(doc: dict, out, only_with: str | None = None) -> None:
    """Latency of every backend and the ratios to the first, one Markdown row per point;
    ``only_with`` keeps the rows where that backend has a result (MPI: float32 only)."""
    labels = doc["config"]["backends"]
    base = labels[0]
    headers = ["op", "dtype", "bytes"] + [f"{lb} us" for lb in labels] + \
              [f"{lb}/{base} x" for lb in labels[1:]]
    lines = []
    for row in doc["rows"]:
        if only_with and not _ok(row["results"].get(only_with)):
            continue
        res = row["results"]
        cells = [SHORT_OP.get(row["op"], row["op"]), row["dtype"], fmt_bytes(row["bytes"])]
        cells += [fmt_us(res[lb]["lat_us"] / 1e6) if _ok(res.get(lb)) else "n/a" for lb in labels]
        cells += ["n/a" if row["ratio"].get(f"{lb}/{base}") is None else f"{row['ratio'][f'{lb}/{base}']:.2f}"
                  for lb in labels[1:]]
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h) for i, h in enumerate(headers)]

    def fmt(cells):
        return "| " + " | ".join(c.ljust(w) if i < 2 else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |\n"

    out.write(fmt(headers))
    out.write("|" + "|".join((":" + "-" * (w + 1)) if i < 2 else ("-" * (w + 1) + ":")
                             for i, w in enumerate(widths)) + "|\n")
    for cells in lines:
        out.write(fmt(cells))
    out.flush()
