#!/usr/bin/env python3
"""Plot a bench/sweep.py JSON file.

    python -m shmcoll.sweep_plot results.json out.png [--busbw]   (or bench/plot.py)

One row per op: latency (us) and bandwidth (GB/s) vs size in bytes, log-log; one line per
backend (colour) and dtype (line style); the bandwidth panels carry a horizontal line at the
memcpy ceiling measured by the sweep.  ``--busbw`` plots bus bandwidth instead of algbw.
"""
from __future__ import annotations

import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "x"]


def human_bytes(x: float, _pos=None) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if x >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", help="file written by bench/sweep.py --json")
    p.add_argument("out", help="image to write (png, svg, pdf ...)")
    p.add_argument("--busbw", action="store_true", help="plot busbw instead of algbw")
    args = p.parse_args(argv)

    with open(args.json) as f:
        doc = json.load(f)
    rows = doc["rows"]
    if not rows:
        print("no rows in", args.json, file=sys.stderr)
        return 1
    backends = doc["config"]["backends"]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    bw_key = "busbw_gbps" if args.busbw else "algbw_gbps"
    bw_name = "busbw" if args.busbw else "algbw"
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    memcpy = doc.get("memcpy_gbps")

    fig, axes = plt.subplots(len(ops), 2, figsize=(12, 3.6 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        ax_lat, ax_bw = axes[i]
        for bi, be in enumerate(backends):
            for di, dt in enumerate(dtypes):
                pts = sorted((r["bytes"], r["results"][be]) for r in rows
                             if r["op"] == op and r["dtype"] == dt
                             and r["results"].get(be, {}).get("status") == "ok")
                if not pts:
                    continue
                xs = [b for b, _ in pts]
                style = dict(color=colors[bi % len(colors)], linestyle=STYLES[di % len(STYLES)],
                             marker=MARKERS[di % len(MARKERS)], markersize=3,
                             label=f"{be} {dt}")
                ax_lat.plot(xs, [res["lat_us"] for _, res in pts], **style)
                ax_bw.plot(xs, [res[bw_key] for _, res in pts], **style)
        if memcpy:
            ax_bw.axhline(memcpy, color="black", linewidth=1, linestyle="--",
                          label=f"memcpy {memcpy:.1f} GB/s")
        ax_lat.set_ylabel("latency (us)")
        ax_bw.set_ylabel(f"{bw_name} (GB/s)")
        for ax, what in ((ax_lat, "latency"), (ax_bw, bw_name)):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(human_bytes))
            ax.set_xlabel("bytes")
            ax.set_title(f"{op}: {what}")
            ax.grid(True, which="major", alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7)
    m = doc.get("machine", {})
    fig.suptitle(f"{m.get('cpu_model', '?')}, {m.get('logical_cpus', '?')} CPUs, "
                 f"world size {m.get('world_size', '?')}, torch {m.get('torch', '?')}, "
                 f"{m.get('date', '')}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
