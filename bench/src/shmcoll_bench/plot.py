#!/usr/bin/env python3
"""Plot sweep results: latency and bandwidth vs size, one row of panels per op.

    python -m shmcoll_bench.plot results.json out.png [--busbw]
    python -m shmcoll_bench.plot sweep.json mpi.json out.png     # shm, gloo and MPI together

Every argument but the last is a JSON document of shmcoll_bench.sweep or shmcoll_bench.mpi; several
are merged (shmcoll_bench.results.merge: rows matched by op, dtype and bytes).  The last is the
image to write (PNG, SVG, PDF ... by its extension).

Log-log panels, one line per backend (colour) and dtype (line style).  The black dashed line
is the memcpy ceiling that the torch sweep measured with every rank copying at once, drawn in
the panel's own units, so that "busbw = memcpy" is the same line whichever is plotted: on the
bandwidth panel memcpy GB/s (busbw) or memcpy / busbw factor (algbw); on the latency panel
the time to move the message's bus bytes at memcpy speed.  ``--busbw`` plots bus bandwidth
instead of algbw.  Needs matplotlib (``pip install matplotlib``; shmcoll-bench's ``compare`` extra has it).
"""
from __future__ import annotations

import argparse
import sys

from shmcoll_bench import results as sweep_results

STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "x"]
# Fixed colours for the usual backends, so every plot reads the same way.
BACKEND_COLORS = {"shm": "tab:blue", "gloo": "tab:orange", "mpi": "tab:green"}
OTHER_COLORS = ["tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]


def human_bytes(x: float, _pos=None) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if x >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def backend_colors(labels: list[str]) -> dict:
    others = iter(OTHER_COLORS * (1 + len(labels) // len(OTHER_COLORS)))
    return {lb: BACKEND_COLORS.get(lb) or next(others) for lb in labels}


def plot(doc: dict, out_path: str, busbw: bool = False) -> None:
    """Draws a (possibly merged) sweep document into ``out_path``; needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    rows = doc["rows"]
    if not rows:
        raise ValueError("the document has no rows")
    backends = doc["config"]["backends"]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    bw_key = "busbw_gbps" if busbw else "algbw_gbps"
    bw_name = "busbw" if busbw else "algbw"
    colors = backend_colors(backends)
    memcpy = doc.get("memcpy_gbps")

    fig, axes = plt.subplots(len(ops), 2, figsize=(12, 3.6 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        ax_lat, ax_bw = axes[i]
        for ax in (ax_lat, ax_bw):  # log scales first: the latency panel's limits are read below
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
        for be in backends:
            for di, dt in enumerate(dtypes):
                pts = sorted((r["bytes"], r["results"][be]) for r in rows
                             if r["op"] == op and r["dtype"] == dt
                             and r["results"].get(be, {}).get("status") == "ok")
                if not pts:
                    continue  # e.g. MPI has no bfloat16
                xs = [b for b, _ in pts]
                style = dict(color=colors[be], linestyle=STYLES[di % len(STYLES)],
                             marker=MARKERS[di % len(MARKERS)], markersize=3, label=f"{be} {dt}")
                ax_lat.plot(xs, [res["lat_us"] for _, res in pts], **style)
                ax_bw.plot(xs, [res[bw_key] for _, res in pts], **style)
        factor = next((r["busbw_factor"] for r in rows if r["op"] == op and r.get("busbw_factor")), 1.0)
        if memcpy:
            sizes = sorted({r["bytes"] for r in rows if r["op"] == op})
            ceiling = memcpy if busbw else memcpy / factor
            ax_bw.axhline(ceiling, color="black", linewidth=1, linestyle="--",
                          label=f"memcpy ceiling ({memcpy:.1f} GB/s per rank)")
            if ax_lat.lines:
                # Keep the measured lines' range: the bound at 8 B is far below every latency
                # and would squash them into the top of the panel.
                ax_lat.set_ylim(ax_lat.get_ylim())
            ax_lat.plot(sizes, [s * factor / memcpy / 1e3 for s in sizes], color="black", linewidth=1,
                        linestyle="--", label="memcpy bound")
        ax_lat.set_ylabel("latency (us)")
        ax_bw.set_ylabel(f"{bw_name} (GB/s)")
        for ax, what in ((ax_lat, "latency"), (ax_bw, bw_name)):
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
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="one or more JSON files of the sweeps, then the image to write")
    p.add_argument("--busbw", action="store_true", help="plot busbw instead of algbw")
    args = p.parse_args(argv)
    if len(args.files) < 2:
        p.error("give at least one JSON file and the image to write")
    *inputs, out = args.files
    if out.endswith(".json"):
        p.error(f"the last argument is the image to write, not a JSON file: {out}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("error: plotting needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 1
    try:
        doc = sweep_results.merge([sweep_results.load(path) for path in inputs])
        plot(doc, out, busbw=args.busbw)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
