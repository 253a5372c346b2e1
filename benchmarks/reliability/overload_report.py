"""The overload run, the engines side by side: report.json, report.md and overload.png
(each engine's accepted and refused p99 per second of arrivals)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

from benchmarks.load import cli, stats
from benchmarks.load.resources import FRONTEND, WORKERS


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.0f}"


def _tail(summary: Optional[stats.LatencySummary]) -> str:
    return "-" if summary is None else f"{summary.p50_ms:.0f} / {stats.tail_text(summary, 0, unit='', label=False)}"


def rows(results: Sequence[Any]) -> list[tuple]:
    out = []
    for r in results:
        out.append((cli.ENGINE_NAMES.get(r.engine, r.engine), f"{r.capacity_rps:.1f}", f"{r.offered_rps:.0f}",
                    r.traffic.sent, r.traffic.ok, r.rejected_503, r.traffic.lost,
                    f"{r.served_rps:.1f} ({r.served_rps / r.capacity_rps:.2f}x)" if r.served_rps else "-",
                    _tail(r.accepted), _ms(r.p99_bound_ms), _tail(r.refused),
                    f"{r.rss_growth_pct(FRONTEND):+.0f}% / {r.rss_growth_pct(WORKERS):+.0f}%",
                    "passed" if r.passed else "FAILED: " + "; ".join(r.problems)))
    return out


def markdown(results: Sequence[Any], command: str) -> str:
    first = results[0]
    lines = [
        f"# Overload: {first.model} on {', '.join(cli.ENGINE_NAMES.get(r.engine, r.engine) for r in results)}",
        "",
        f"Command: `{command}`. Each engine in turn, a fresh server of {first.model} alone with "
        f"job_queue_size {first.job_queue_size} and the shipped values; its capacity measured first "
        "(closed loop, as many clients as the server holds: job_queue_size + batch), then open-loop Poisson "
        f"arrivals at {first.offered_rps / first.capacity_rps:.0f}x that for {first.seconds:.0f} s over 96 "
        "connections. Latency runs from each request's scheduled "
        "arrival, so a client that backs up counts.",
        "",
        *cli.table(("engine", "capacity req/s", "offered req/s", "sent", "200", "503", "lost",
                    "200s per second (of capacity)", "accepted p50 / p99 ms", "p99 bound ms", "refused p50 / p99 ms",
                    "peak RSS, rest / workers", "verdict"), rows(results)),
        "",
        "The p99 bound: twice the time the requests an accepted one may wait behind take to drain at the rate "
        "served, plus 0.5 s (benchmarks/reliability/overload.py). Rest: TorchServe's frontend; every process "
        "of the Ray cluster but the model's replicas.",
        "",
        "![accepted and refused p99 per second](overload.png)",
        "",
    ]
    return "\n".join(lines)


def plot(results: Sequence[Any], path: Path) -> None:
    with cli.figure(path, 1, 2, figsize=(11, 4)) as axes:
        for r in results:
            name = cli.ENGINE_NAMES.get(r.engine, r.engine)
            seconds = [row[0] for row in r.timeline]
            for ax, index, title in ((axes[0], 2, "accepted (200)"), (axes[1], 4, "refused (503)")):
                ax.plot(seconds, [row[index] for row in r.timeline], "o-", label=name)
                ax.set_title(f"{title}: p99 per second of arrivals")
                ax.set_xlabel("second of the run (scheduled arrival)")
                ax.set_ylabel("p99 (ms)")
                ax.set_yscale("log")
        for ax in axes:
            ax.legend()


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    return {f.name: getattr(value, f.name) for f in fields(value)} if is_dataclass(value) else str(value)


def write(folder: Path, results: Sequence[Any], command: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    content = {"command": command, "results": list(results)}
    (folder / "report.json").write_text(json.dumps(content, indent=1, default=_plain), encoding="utf-8")
    (folder / "report.md").write_text(markdown(results, command), encoding="utf-8")
    plot(results, folder / "overload.png")
    return folder / "report.md"
