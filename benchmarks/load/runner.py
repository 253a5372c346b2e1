"""Drive one running TorchServe through a load plan and collect every point's figures.

For each point: client figures (loadgen), the server's breakdown over the same windows (diff of
two /metrics scrapes) and CPU/RSS of the frontend, the workers and the generator itself.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Optional

from benchmarks.load import loadgen, resources, server_metrics, stats
from benchmarks.load.budget import Budget, BudgetSpent
from benchmarks.load.capacity import Point, RateSearch, RateSettings, find_max_rate
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.loadgen import LoadResult, Payload, Target
from benchmarks.load.stats import StabilityRule
from build.catalogue import FRONTEND_KEYS
from serving.launcher import TorchServe

Progress = Callable[[str], None]
_THREADS = re.compile(r"W-\d+-(\S+)_[^_\s]+-stdout MODEL_LOG - .*?threads=(\d+)")


@dataclass(frozen=True)
class LoadPlan:
    """What load a server gets: the closed-loop sweep, then open-loop points."""

    levels: tuple[int, ...]
    min_gain_pct: Optional[float]  # None: run every level of the sweep
    rates: tuple[float, ...]  # absolute open-loop rates; empty: fractions of the measured peak
    rate_fractions: tuple[float, ...]
    rule: StabilityRule
    window_s: float
    connections: int = 64
    warmup_s: float = 5.0  # unmeasured load before the first point
    min_window_requests: int = 20  # open loop at low rates: longer windows (up to 4x) for this many arrivals
    # Open loop: the reported windows together hold at least this many arrivals (a p99 over 300
    # requests is the 3rd-worst answer; over 2,000 the 20th): windows lengthen at low rates.
    point_requests: int = 2000
    wait_quiet_s: float = 0.0  # > 0: a point during which other processes were busy is measured again
    # After the listed rates: up to this many more open-loop points bisect the highest rate within
    # slo_ms (benchmarks.load.capacity, the tuner's search), so the capacity is not the nearest
    # listed rate below it. 0 or no slo_ms: the listed rates only.
    capacity_points: int = 0
    slo_ms: Optional[float] = None
    # With a capacity found: one more point at this share of it (the tail at low load). 0: none.
    low_load_fraction: float = 0.0
    # > 0: the capacity search brackets the SLO with short points of this many arrivals first (scouts,
    # never a capacity), then measures the bracket's passing rate to point_requests (stepping down
    # while it fails). 0: every search point is full length.
    scout_requests: int = 0

    def to_json(self) -> dict:
        out = asdict(self)
        out["rule"] = asdict(self.rule)
        return out

    def capacity_settings(self) -> RateSettings:
        return RateSettings(max_points=self.capacity_points)


@dataclass(frozen=True)
class Measured:
    """One measured point: JSON figures, plus the raw latencies (ms) for the CDF plot."""

    figures: dict
    latencies_ms: tuple[float, ...]


@dataclass(frozen=True)
class ServerRun:
    label: str
    points: tuple[Measured, ...]
    worker_threads: tuple[int, ...]  # as each worker logged it
    description: dict  # GET /models/<name>: batch size, delay, workers as the frontend holds them


def open_point_min_s(rate_rps: float, plan: LoadPlan, requests: int) -> float:
    """The least an open-loop point takes: its warm-up and reported windows, and the settle before."""
    window = open_window_s(rate_rps, plan.window_s, requests, plan.rule.last, plan.min_window_requests)
    return (plan.rule.warmup + plan.rule.last) * window + 1.0


def open_window_s(rate_rps: float, window_s: float, point_requests: int, windows: int,
                  min_window_requests: int = 0) -> float:
    """One open-loop window's length at this rate: `windows` reported windows hold at least
    `point_requests` arrivals, and each at least `min_window_requests` (up to 4x the window)."""
    rate = max(rate_rps, 1e-9)
    return max(min(4 * window_s, max(window_s, min_window_requests / rate)), point_requests / (rate * windows))


def warm_up(target: Target, payloads: Sequence[Payload], seconds: float, concurrency: int) -> None:
    """Unmeasured load, several requests in flight so that every worker and batch size is hit."""
    result = loadgen.closed_loop(target, payloads, concurrency, StabilityRule(last=1, max_windows=1, warmup=0),
                                 window_s=seconds, progress=lambda _: None)
    if not any(s.ok for s in result.samples):
        raise BenchmarkError(f"warm-up: no request succeeded (statuses {stats.errors_by_status(result.samples)})")


def settle(ts: TorchServe, model: str, timeout_s: float = 180.0) -> None:
    """Wait until the server has no queued requests left from the last point."""
    deadline = time.monotonic() + timeout_s
    while ts.describe(model).get("jobQueueStatus", {}).get("pendingRequests", 0) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(0.5)  # the batch in the worker


def others_pct(result: LoadResult) -> float:
    """CPU (% of one core) that processes other than ours used during the point's reported windows."""
    (_, (_, before)), (_, (_, after)) = result.reported_edges
    return resources.usage(before, after)[resources.OTHERS].cpu_pct


def point(result: LoadResult, model: str, remeasured: bool = False, scout: bool = False) -> Measured:
    figures = result.figures()
    figures["remeasured"] = remeasured
    figures["scout"] = scout
    (_, (scrape_a, usage_a)), (_, (scrape_b, usage_b)) = result.reported_edges
    figures["server"] = server_metrics.breakdown(scrape_a, scrape_b, model).to_json()
    figures["resources"] = {name: u.to_json() for name, u in resources.usage(usage_a, usage_b).items()}
    latencies = tuple(sorted(v * 1000.0 for v in result.selection().latencies_s))  # the figures' own requests
    return Measured(figures, latencies)


def worker_threads(ts: TorchServe, model: str) -> tuple[int, ...]:
    return tuple(int(n) for name, n in _THREADS.findall(ts.log_text("model_log.log")) if name == model)


def run_server(label: str, ts: TorchServe, model: str, plan: LoadPlan, progress: Progress,
               budget: Optional[Budget] = None) -> ServerRun:
    """`budget`: open-loop points that would not end within it are not started (budget.left_out
    names them); the points measured until then are the run."""
    description = ts.describe(model)
    workers = max(1, len(description.get("workers", [])))
    target = Target.for_model(ts.inference_url, model, ts.tokens.inference,
                              timeout_s=float(description.get("responseTimeout", 120)))
    payloads = loadgen.payloads_for(model)
    groups = resources.ProcessGroups.for_server(ts.java_pid, ts.worker_pids(model))

    def probe():
        return server_metrics.Scrape.of(ts.metrics_text()), groups.read()

    def say(line: str) -> None:
        progress(f"[{label}] {line.strip()}")

    in_flight = min(64, 2 * workers * int(description.get("batchSize", 1)))
    say(f"warm-up: {plan.warmup_s:g} s at concurrency {in_flight}")
    warm_up(target, payloads, plan.warmup_s, in_flight)
    again: list[LoadResult] = []

    def measured(run: Callable[[], LoadResult]) -> LoadResult:
        settle(ts, model)
        result = run()
        noise = others_pct(result)
        if plan.wait_quiet_s > 0 and noise > resources.NOISY_OTHERS_PCT:
            say(f"other processes used {noise:.0f}% of a core during this point: measuring it again when quiet")
            resources.wait_for_quiet(plan.wait_quiet_s, say, ours=[ts.java_pid])
            settle(ts, model)
            result = run()
            again.append(result)
        return result

    results: list[LoadResult] = loadgen.closed_sweep(
        plan.levels,
        lambda c: measured(lambda: loadgen.closed_loop(target, payloads, c, plan.rule, plan.window_s, probe, say)),
        plan.min_gain_pct, say)
    peak = max(r.figures()["throughput_rps"] for r in results)
    rates = plan.rates or tuple(round(f * peak, 2) for f in plan.rate_fractions)

    scouts: list[LoadResult] = []

    def open_point(rate: float, scout: bool = False) -> Point:
        requests = plan.scout_requests if scout else plan.point_requests
        kind = "scout" if scout else "open loop"
        if budget is not None:
            budget.require(f"{label} {kind} {rate:g} req/s", open_point_min_s(rate, plan, requests))
        say(f"{kind}, Poisson {rate:g} req/s" + (f" ({requests} arrivals: brackets, never a capacity)" if scout else ""))
        window_s = open_window_s(rate, plan.window_s, requests, plan.rule.last, plan.min_window_requests)
        rule = replace(plan.rule, max_windows=plan.rule.last) if scout else plan.rule
        results.append(measured(lambda: loadgen.open_loop(
            target, payloads, rate, rule, window_s, plan.connections, seed=int(rate * 1000),
            drain_s=max(10.0, 2 * window_s), probe=probe, progress=say)))
        if scout:
            scouts.append(results[-1])
        return Point.of(results[-1].figures(), scout=scout)

    try:
        searched = plan.capacity_points and plan.slo_ms
        listed = [open_point(rate, scout=bool(searched and plan.scout_requests)) for rate in rates if rate > 0]
        if searched and listed:
            best = search_capacity(open_point, listed, plan, say)
            if best is not None and plan.low_load_fraction > 0:
                open_point(round(plan.low_load_fraction * best.achieved_rps, 2))
    except BudgetSpent as spent:
        say(f"{spent}: reporting the {len(results)} point(s) measured")
    return ServerRun(label, tuple(point(r, model, any(r is a for a in again), any(r is s for s in scouts))
                                  for r in results),
                     worker_threads(ts, model),
                     {k: description.get(k) for k in FRONTEND_KEYS} | {"workers": workers})


def search_capacity(open_point: Callable[..., Point], listed: Sequence[Point], plan: LoadPlan,
                    say: Progress) -> Optional[Point]:
    """The highest full-length passing point. With scouts: the scouts' bracket first, then its passing
    rate measured in full; when that fails, the same search again with full points only, from one
    step below it (up to capacity_points more)."""
    settings = plan.capacity_settings()
    found = capacity_search(lambda rate: open_point(rate, scout=bool(plan.scout_requests)), listed, plan.slo_ms,
                            settings)
    best = f"{found.best.achieved_rps:.1f} req/s" if found.best else "no rate"
    say(f"capacity search: {len(found.points)} more point(s); {best} within p99 <= {plan.slo_ms:g} ms"
        + (" (scouts)" if plan.scout_requests else ""))
    if not plan.scout_requests or found.best is None:
        return found.best
    full = open_point(found.best.rate_rps)
    if not full.passes(plan.slo_ms):
        say(f"the scouts' {found.best.rate_rps:g} req/s fails in full: searching below it with full points")
        full = find_max_rate(open_point, full.rate_rps / settings.step, plan.slo_ms, settings, known=[full]).best
    if full is not None:
        say(f"capacity: {full.achieved_rps:.1f} req/s within p99 <= {plan.slo_ms:g} ms over {plan.point_requests}+ "
            "arrivals")
    return full


def capacity_search(probe: Callable[[float], Point], listed: Sequence[Point], slo_ms: float,
                    settings: RateSettings) -> RateSearch:
    """Bisect between the listed points (up from the highest passing one, or down from the lowest)."""
    passing = [p for p in listed if p.passes(slo_ms)]
    if passing:
        start = max(p.rate_rps for p in passing) * settings.step
    else:
        start = min(p.rate_rps for p in listed) / settings.step
    return find_max_rate(probe, start, slo_ms, settings, known=listed)


# -- what a set of points says ----------------------------------------------------------------
def peak(points: Sequence[Measured]) -> Optional[dict]:
    """The closed-loop point with the highest throughput (among those with answers); None without a
    closed-loop sweep (two levels at least: one client alone is no peak). Peaks compare like for like:
    an open-loop point offered above capacity measures an overload, not what the server sustains."""
    closed = [p.figures for p in points if p.figures["latency_ms"] and p.figures["mode"] == "closed"]
    if len({f["level"] for f in closed}) < 2:
        return None
    return max(closed, key=lambda f: f["throughput_rps"])


def best_within(points: Sequence[Measured], slo_ms: float) -> Optional[dict]:
    """The highest-throughput open-loop point that passes (capacity.Point.passes: the tuner's rule too;
    closed-loop clients wait for answers before sending, so their p99 hides the queueing a latency
    target is about)."""
    fitting = [p.figures for p in points if p.figures["mode"] == "open" and not p.figures.get("scout")
               and Point.of(p.figures).passes(slo_ms)]
    return max(fitting, key=lambda f: f["throughput_rps"], default=None)


def summary(run: ServerRun, slo_ms: float) -> dict[str, Optional[float]]:
    top, fit = peak(run.points), best_within(run.points, slo_ms)
    top_latency = (top or {}).get("latency_ms") or {}
    fit_latency = (fit or {}).get("latency_ms") or {}
    return {
        "peak_rps": top["throughput_rps"] if top else None,
        "peak_p99_ms": top_latency.get("p99_ms"),
        "peak_p90_ms": top_latency.get("p90_ms"),
        "peak_samples": top_latency.get("count"),  # a report prints a thin p99 as its p90 (stats.tail_text)
        "peak_point": f"{top['mode']} {top['level']:g}" if top else None,
        "slo_rps": fit["throughput_rps"] if fit else 0.0,
        "slo_p99_ms": fit_latency.get("p99_ms"),
        "slo_p90_ms": fit_latency.get("p90_ms"),
        "slo_samples": fit_latency.get("count"),
        "slo_point": f"{fit['mode']} {fit['level']:g}" if fit else None,
    }
