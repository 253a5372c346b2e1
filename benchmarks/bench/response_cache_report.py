"""The response-cache benchmark's report: report.md (the tables) and the plots
(benchmarks/bench/response_cache.py measures)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.load import stats
from benchmarks.load.cli import figure, table


def capacity_text(arm: dict) -> str:
    if arm["capacity_rps"] == 0:
        lowest = min((p["offered_rps"] for p in arm["points"]), default=None)
        return "none of the measured rates" + (f" (down to {lowest} req/s)" if lowest is not None else "")
    floor = " or more (the load generator fell behind above it: a floor)" if arm["floor"] else ""
    return f"{arm['capacity_rps']} req/s{floor}"


def markdown(report: dict) -> str:
    lines = [f"# Response cache: {report['model']} ({report['when']})", "", f"Command: `{report['command']}`", "",
             f"One TorchServe, {report['workers']} workers, batchSize {report['batch_size']}, the archive with "
             f"`response_cache.max_mib: {report['max_mib']}`; \"no cache\" sends `Cache-Control: no-cache`. "
             f"Capacity: the highest open-loop Poisson rate with p99 <= {report['slo_ms']:g} ms and every request "
             f"answered (points of >= {report['point_requests']} arrivals, {report['window_s']:g} s windows), the "
             "two arms' searches measuring in turn.", ""]
    for workload, title in (("zipf", f"Zipf s={report['zipf_s']} over {report['universe']} inputs"),
                            ("distinct", "all-distinct inputs (never a hit)")):
        arms = report[workload]
        lines += [f"## {title}", "", *table(
            ("arm", "offered req/s", "achieved req/s", "p99 ms", "requests", "stable", "passes"),
            [(arm, p["offered_rps"], p["achieved_rps"], stats.tail_cell(p["latency_ms"]), p["requests"],
              "yes" if p["stable"] else "no", "yes" if p["passes"] else "no")
             for arm in ("cache", "no_cache") for p in arms[arm]["points"]])]
        ratio = report[f"{workload}_ratio"]
        floor = " (a floor: the cache arm's limit was the load generator's)" if arms["cache"]["floor"] else ""
        ratio_text = f"**{ratio}x**" if ratio is not None else "no ratio (no rate met the SLO without the cache)"
        lines += ["", f"Capacity at the SLO: cache {capacity_text(arms['cache'])}, no cache "
                      f"{capacity_text(arms['no_cache'])}: {ratio_text}{floor}.", ""]
    pr = report["distinct_pair_ratio"]
    lines += [f"## All-distinct inputs, throughput at concurrency {pr['level']}, arms alternating", "",
              *table(("pair", "cache req/s", "no cache req/s", "cache / no cache"),
                     [(i + 1, p["cache"], p["no_cache"], f"{p['ratio']:.3f}")
                      for i, p in enumerate(report["distinct_pairs"])])]
    lines += ["", f"Median ratio **{pr['median']:.3f}** (range {pr['min']:.3f}-{pr['max']:.3f} over "
                  f"{len(report['distinct_pairs'])} pairs).", ""]
    cost = report["cost"]
    lines += [f"The cache's own work per request, in-process ({cost['requests']} distinct bodies, "
              f"{cost['answer_bytes']}-byte answers): **{cost['us_per_request']} us** (key + lookup + store; "
              f"runs {cost['runs_us']}). At the no-cache arm's capacity on all-distinct inputs that is "
              f"{cost['share_of_service']:.2%} of a request's worker time.", ""]
    lines += [f"Server counters at the end: {report['metrics']}.", "", "![capacity](capacity.png)", ""]
    return "\n".join(lines)


def plot(report: dict, folder: Path) -> None:
    with figure(folder / "capacity.png", 1, 3, figsize=(14, 3.8)) as axes:
        ratios = [p["ratio"] for p in report["distinct_pairs"]]
        axes[2].bar(range(1, len(ratios) + 1), ratios, color="#2ca02c")
        axes[2].axhline(1.0, color="grey", linewidth=0.8)
        axes[2].axhline(0.97, color="red", linewidth=0.8, linestyle="--", label="3% slower")
        axes[2].set_ylim(min(0.85, min(ratios) - 0.02), max(1.15, max(ratios) + 0.02))
        axes[2].set_xlabel("alternating pair")
        axes[2].set_title(f"all-distinct, cache / no cache at concurrency {report['distinct_pair_ratio']['level']}")
        axes[2].legend()
        for ax, workload in zip(axes, ("zipf", "distinct")):
            for arm, style in (("cache", "o-"), ("no_cache", "s--")):
                points = [p for p in report[workload][arm]["points"] if p["p99_ms"] is not None]
                ax.plot([p["achieved_rps"] for p in points], [p["p99_ms"] for p in points], style, label=arm)
            ax.axhline(report["slo_ms"], color="grey", linewidth=0.8)
            ax.set_yscale("log")
            ax.set_xlabel("achieved req/s (open loop)")
            ax.set_title(workload)
            ax.legend()
        axes[0].set_ylabel("p99 latency, ms")
