"""Soak: a bounded run at ~70% of a model's measured capacity, watching for errors and leaks.

Open-loop Poisson arrivals at `fraction` x capacity: a warm-up at the same rate (the JVM touches
its heap's pages as its young generation grows: RSS that rises then levels off), then `minutes`
measured, in windows; at every window edge the RSS of the frontend (JVM) and of the workers is
read. Checked: zero errors over the whole run, and RSS growth under 5% per group from the start of
the measured part to its end (the RSS floor of its first and last thirds). Writes a small report (JSON, and a
PNG of RSS and p99 over time) under <--out>/soak-<time>/.

The soak's server starts its JVM with a 512 MB initial heap, pre-touched (`-Xms512m
-XX:+AlwaysPreTouch` added to its vmargs, see `soak_vmargs`; the maximum heap stays the default).
Without them the frontend's RSS rises for minutes as the JVM faults in heap pages it reserved at
start, and steps up each time G1 grows its small default initial heap under load (how much:
docs/results.md#reliability-and-soak): neither is a leak. With them, RSS moves only when the
footprint really does (the heap outgrowing 512 MB, direct buffers, threads).

    python -m benchmarks soak --minutes 10      # the default; `make reliability` runs a short one
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Optional

from benchmarks.load import cli, loadgen, stats
from benchmarks.load.resources import FRONTEND, WORKERS
from benchmarks.load.traffic import (
    Traffic,
    capacity,
    fixed_windows,
    others_meter,
    payloads,
    rss_probe,
    say,
    target,
)
from serving import properties
from serving.launcher import TorchServe
from serving.repo import DEFAULT_CONFIG

GROWTH_LIMIT_PCT = 5.0
SOAK_JVM = ("-Xms512m", "-XX:+AlwaysPreTouch")
GROUPS = (FRONTEND, WORKERS)


@dataclass(frozen=True)
class Point:
    """One window: when it ended (s from the start), its answers, and the RSS at its end."""

    t_s: float
    throughput_rps: float
    p99_ms: Optional[float]
    errors: int
    rss_mb: Mapping[str, float]


@dataclass(frozen=True)
class SoakResult(cli.Checked):
    model: str
    capacity_rps: float
    rate_rps: float
    minutes: float  # measured, after the warm-up
    points: tuple[Point, ...]
    warmup_points: int  # the first points are the warm-up: not part of the growth
    traffic: Traffic
    p99_ms: Optional[float]  # over the whole run
    others_cpu_pct: float = 0.0  # CPU other processes on the machine used meanwhile (% of one core)
    latency: Optional[stats.LatencySummary] = None  # over the whole run (p99_ms's)

    def growth_pct(self, group: str) -> Optional[float]:
        """The RSS floor of the last third of the measured readings over that of the first third.

        A leak raises the floor; a batch's transient buffers (tens of MB in a worker decoding big
        photos) only lift single readings, which a median of few readings would still catch."""
        readings = [p.rss_mb[group] for p in self.points[self.warmup_points:]]
        k = len(readings) // 3
        if k < 1:
            return None
        baseline, final = min(readings[:k]), min(readings[-k:])
        return 100.0 * (final - baseline) / baseline if baseline else None

    @property
    def problems(self) -> tuple[str, ...]:
        out = []
        if self.traffic.ok != self.traffic.sent or not self.traffic.sent:
            out.append(f"not every request succeeded: {self.traffic.describe()}")
        for group in GROUPS:
            growth = self.growth_pct(group)
            if growth is None:
                out.append(f"too few RSS readings for {group} growth")
            elif growth >= GROWTH_LIMIT_PCT:
                out.append(f"{group} RSS grew {growth:.1f}% (limit {GROWTH_LIMIT_PCT:.0f}%)")
        return tuple(out)

    def summary(self) -> str:
        growth = ", ".join(f"{g} {self.growth_text(g)}" for g in GROUPS)
        tail = stats.tail_text(self.latency or {"count": None, "p99_ms": self.p99_ms}, 0)
        return (f"soak {self.model}: {self.minutes:g} min at {self.rate_rps:.1f} req/s "
                f"({self.rate_rps / self.capacity_rps:.0%} of {self.capacity_rps:.1f} req/s): "
                f"{self.traffic.describe()}; {tail}; RSS growth {growth}; other processes used "
                f"{self.others_cpu_pct:.0f}% CPU meanwhile")

    def growth_text(self, group: str) -> str:
        growth = self.growth_pct(group)
        return "n/a" if growth is None else f"{growth:+.1f}%"

    def to_json(self) -> dict:
        return {
            "model": self.model, "capacity_rps": self.capacity_rps, "rate_rps": self.rate_rps,
            "minutes": self.minutes, "warmup_points": self.warmup_points, "p99_ms": self.p99_ms,
            "samples": None if self.latency is None else self.latency.count,
            "others_cpu_pct": self.others_cpu_pct,
            "traffic": {"sent": self.traffic.sent, "answered": self.traffic.answered, "ok": self.traffic.ok,
                        "lost": self.traffic.lost, "errors": dict(self.traffic.errors)},
            "rss_growth_pct": {g: self.growth_pct(g) for g in GROUPS}, "growth_limit_pct": GROWTH_LIMIT_PCT,
            "passed": self.passed, "problems": list(self.problems),
            "points": [{"t_s": p.t_s, "throughput_rps": p.throughput_rps, "p99_ms": p.p99_ms, "errors": p.errors,
                        "rss_mb": dict(p.rss_mb)} for p in self.points],
        }


def soak_vmargs(config_path: Path = DEFAULT_CONFIG) -> Mapping[str, str]:
    """extra_properties for the soak's server: its config's vmargs plus SOAK_JVM (an initial heap
    size the config already sets is kept)."""
    current = properties.read(config_path).get("vmargs", "").split()
    added = [flag for flag in SOAK_JVM if flag not in current
             and not (flag.startswith("-Xms") and any(f.startswith("-Xms") for f in current))]
    return {"vmargs": " ".join(current + added)}


def soak(ts: TorchServe, model: str, minutes: float, capacity_rps: float, fraction: float = 0.7,
         window_s: Optional[float] = None, warmup_s: Optional[float] = None) -> SoakResult:
    window_s = window_s or (10.0 if minutes >= 5 else 5.0)
    windows = max(4, round(minutes * 60 / window_s))
    warmup = max(1, round((warmup_s if warmup_s is not None else (60.0 if minutes >= 5 else 20.0)) / window_s))
    rate = fraction * capacity_rps
    say(f"soak {model}: {rate:.1f} req/s ({fraction:.0%} of capacity), {warmup * window_s:g} s warm-up then "
        f"{windows * window_s / 60:g} min, {window_s:g} s windows")
    others = others_meter(ts)
    run = loadgen.open_loop(target(ts, model), payloads(model), rate, fixed_windows(windows, warmup), window_s,
                            connections=32, probe=rss_probe(ts, ts.list_models()),
                            progress=lambda line: say(line.strip()))
    start = run.edges[0][0]
    points = tuple(
        Point(end - start, w.throughput_rps, w.p99_ms, w.completed - w.ok,
              MappingProxyType({g: rss[g] / 2**20 for g in GROUPS}))
        for w, (end, rss) in zip(run.windows, run.edges[1:])
    )
    latency = stats.summarize(s.latency for s in run.samples if s.ok)
    return SoakResult(model, capacity_rps, rate, windows * window_s / 60, points, warmup, Traffic.of(run.samples),
                      None if latency is None else latency.p99_ms, others(), latency)


def write_report(result: SoakResult, out_dir: Path) -> Path:
    """soak.json and soak.png (RSS and p99 over time) in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "soak.json").write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    minutes = [p.t_s / 60 for p in result.points]
    with cli.figure(out_dir / "soak.png", 2, 1, figsize=(8, 6), sharex=True, dpi=100) as (rss_ax, p99_ax):
        for group in GROUPS:
            rss_ax.plot(minutes, [p.rss_mb[group] for p in result.points], marker=".",
                        label=f"{group} ({result.growth_text(group)})")
        rss_ax.set_ylabel("RSS (MB)")
        rss_ax.set_ylim(bottom=0)
        rss_ax.legend(loc="lower right")
        rss_ax.set_title(f"soak {result.model}: {result.rate_rps:.1f} req/s, {result.traffic.ok} ok "
                         f"of {result.traffic.sent}", fontsize=10)
        p99_ax.plot(minutes, [p.p99_ms if p.p99_ms is not None else float("nan") for p in result.points],
                    marker=".", color="#d62728", label="p99 per window")
        p99_ax.set_ylabel("p99 latency (ms)")
        if result.warmup_points:
            for ax in (rss_ax, p99_ax):
                ax.axvspan(0, minutes[result.warmup_points - 1], color="#dddddd", label=None)
            rss_ax.text(0, 5, " warm-up", fontsize=8, va="bottom")
        p99_ax.set_xlabel("minutes")
        p99_ax.set_ylim(bottom=0)
        p99_ax.legend(loc="lower right")
    return out_dir


def main(argv: Sequence[str]) -> int:
    p = cli.parser("soak", __doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="soak length")
    cli.add(p, "model", "model_store", "out", factor={"default": 0.7, "dest": "fraction"},
            window_s={"help": "default 10 (5 under 5 minutes)"}, warmup_s={"help": "default 60 (20 under 5 minutes)"})
    args = p.parse_args(argv)
    model = cli.model_or_first(args.model)
    with TorchServe(args.model_store, extra_properties=soak_vmargs()) as ts:
        result = soak(ts, model, args.minutes, capacity(ts, model), args.fraction, args.window_s, args.warmup_s)
    out = write_report(result, cli.report_folder(args.out, "soak"))
    return cli.verdict(result, report=out)
