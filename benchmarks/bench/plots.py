"""The report's PNG plots: throughput vs p99 (the knee), latency CDF, batch sizes formed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from benchmarks.load import cli
from benchmarks.load.runner import Measured, ServerRun, best_within, peak

COLOURS = {"ours": "#1f77b4", "stock": "#7f7f7f"}


def _label(figures: dict) -> str:
    return f"c={figures['level']:g}" if figures["mode"] == "closed" else f"{figures['level']:g}/s"


def throughput_vs_p99(path: Path, runs: Mapping[str, ServerRun], summary: dict) -> None:
    with cli.figure(path, figsize=(8, 5)) as ax:
        for label, run in runs.items():
            for mode, marker, style in (("closed", "o", "-"), ("open", "s", "--")):
                pts = sorted((p.figures for p in run.points if p.figures["mode"] == mode and p.figures["latency_ms"]),
                             key=lambda f: f["throughput_rps"])
                if not pts:
                    continue
                xs = [f["throughput_rps"] for f in pts]
                ys = [f["latency_ms"]["p99_ms"] for f in pts]
                ax.plot(xs, ys, style, marker=marker, color=COLOURS.get(label), label=f"{label}, {mode} loop")
                for f, x, y in zip(pts, xs, ys):
                    ax.annotate(_label(f), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.axhline(summary["slo_ms"], color="#d62728", linestyle=":", label=f"p99 target {summary['slo_ms']:g} ms")
        ax.axvline(summary["inprocess_items_per_s"], color="#2ca02c", linestyle=":",
                   label=f"in-process limit {summary['inprocess_items_per_s']:.0f}/s")
        ax.set_yscale("log")
        ax.set_xlabel("throughput (successful req/s)")
        ax.set_ylabel("p99 latency (ms, log)")
        ax.set_title("Throughput vs p99 latency")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)


def latency_cdf(path: Path, runs: Mapping[str, ServerRun], slo_ms: float) -> None:
    with cli.figure(path, figsize=(8, 5)) as ax:
        for label, run in runs.items():
            chosen = {}
            top, fit = peak(run.points), best_within(run.points, slo_ms)
            for name, figures in (("peak", top), ("best within target", fit)):
                point = _point_of(run, figures)
                if point is not None and point.latencies_ms and id(point) not in chosen:
                    chosen[id(point)] = (name, point)
            for (name, point), style in zip(chosen.values(), ("-", "--")):
                values = point.latencies_ms
                ys = [(i + 1) / len(values) for i in range(len(values))]
                ax.plot(values, ys, style, color=COLOURS.get(label),
                        label=f"{label} {name} ({_label(point.figures)}, {point.figures['throughput_rps']:.0f} req/s)")
        ax.axvline(slo_ms, color="#d62728", linestyle=":", label=f"p99 target {slo_ms:g} ms")
        ax.axhline(0.99, color="#999999", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms, log, from the intended send time)")
        ax.set_ylabel("fraction of requests")
        ax.set_title("Latency CDF")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")


def _point_of(run: ServerRun, figures: Optional[dict]) -> Optional[Measured]:
    return next((p for p in run.points if p.figures is figures), None)


def batch_sizes(path: Path, runs: Mapping[str, ServerRun]) -> None:
    """Per point of ours: the share of items served in batches of each size."""
    points = [p.figures for p in runs["ours"].points if p.figures["server"]["batches"]]
    with cli.figure(path, figsize=(9, 5)) as ax:
        if not points:
            ax.text(0.5, 0.5, "no batch-size metrics", ha="center", va="center")
        sizes = sorted({int(s) for f in points for s in f["server"]["batch_sizes"]})
        width = 0.8 / max(1, len(points))
        import matplotlib

        cmap = matplotlib.colormaps["viridis"]
        for i, f in enumerate(points):
            counts = f["server"]["batch_sizes"]
            items = sum(int(s) * n for s, n in counts.items()) or 1
            shares = [int(s) * counts.get(str(s), 0) / items for s in sizes]
            xs = [k + (i - (len(points) - 1) / 2) * width for k in range(len(sizes))]
            ax.bar(xs, shares, width=width, color=cmap(i / max(1, len(points) - 1)),
                   label=f"{f['mode']} {_label(f)} (mean {f['server']['mean_batch_size']:.1f})")
        ax.set_xticks(range(len(sizes)), [str(s) for s in sizes])
        ax.set_xlabel("batch size formed by TorchServe")
        ax.set_ylabel("share of items")
        ax.set_title("Batch sizes actually formed (ours, per load point)")
        if points:
            ax.legend(fontsize=7, ncol=2)


def write_all(folder: Path, runs: Mapping[str, ServerRun], summary: dict) -> None:
    throughput_vs_p99(folder / "throughput_vs_p99.png", runs, summary)
    latency_cdf(folder / "latency_cdf.png", runs, summary["slo_ms"])
    batch_sizes(folder / "batch_sizes.png", runs)
