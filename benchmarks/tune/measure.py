"""The tuner's served measurements: open-loop points of candidates on real TorchServes.

One TorchServe at a time through the launcher, started for a candidate on its first point and
kept for that candidate's next points (a rate search probes several rates); the load is the
benchmark's open loop (benchmarks.load.loadgen: Poisson arrivals, latency from the intended send
time). A point whose p99 lies near the SLO, on either side, is measured twice more and the median
decides; with --wait-quiet one that other processes disturbed is measured again when the machine
is quiet.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, TypeVar

from benchmarks.load import loadgen, resources, runner, server_metrics, stats
from benchmarks.load.budget import Budget
from benchmarks.load.capacity import Point, kept_up
from benchmarks.load.stats import StabilityRule
from benchmarks.tune.fit import NOISY_OTHERS_PCT
from benchmarks.tune.space import Candidate
from serving.launcher import TorchServe
from serving.ts_config import device_properties

Progress = Callable[[str], None]
T = TypeVar("T")
# The noise band of a point's p99: within this factor of the SLO, on either side, a p99 could as
# well have fallen on the other side. The stability rule already lets each reported window's p99
# lie its tolerance from their mean, and a second point at the same rate, with another server start
# behind it, spreads wider still; a band that wide on both sides keeps the verdict on a point from
# resting on one roll of that noise, in either direction.
NOISE_BAND = 1.25
# A point in the band is measured this many more times, at the same length; the median p99 of the
# (odd number of) measurements decides.
REMEASUREMENTS = 2
# /metrics must be Prometheus text with our handler counters picked up (as benchmarks.bench does).
METRICS_PROPERTIES = {"metrics_mode": "prometheus", "model_metrics_auto_detect": "true"}


@dataclass(frozen=True)
class LoadSettings:
    window_s: float = 2.0
    rule: StabilityRule = field(default_factory=lambda: StabilityRule(tolerance_pct=15.0, last=3, max_windows=4,
                                                                     warmup=1))
    connections: int = 64
    warmup_s: float = 3.0  # unmeasured load after each server start
    # The reported windows of a point hold at least this many arrivals (windows lengthen at low
    # rates): a p99 over 2,000 requests is the 20th-worst answer, over 300 the 3rd-worst.
    point_requests: int = 2000

    def window_at(self, rate_rps: float, window_s: Optional[float] = None) -> float:
        """One window's length at this rate (the benchmark's rule)."""
        return runner.open_window_s(rate_rps, window_s or self.window_s, self.point_requests, self.rule.last)

    def to_json(self) -> dict:
        return {"window_s": self.window_s, "rule": dict(self.rule.__dict__), "connections": self.connections,
                "warmup_s": self.warmup_s, "point_requests": self.point_requests}


def point_from(result: loadgen.LoadResult, model: str, candidate: Candidate, seconds: float,
               overhead_s: float) -> Point:
    return Point.of(runner.point(result, model).figures, candidate.key, seconds=seconds, overhead_s=overhead_s)


@dataclass(frozen=True)
class ServePlan:
    """How the measurer starts servers for a model and drives them."""

    model: str
    model_store: Path
    config: Path  # the base config.properties
    load: LoadSettings
    slo_ms: float = float("inf")  # which failed points are worth measuring again
    wait_quiet_s: float = 0.0  # > 0: wait for other jobs to finish before each server start
    response_timeout_s: int = 120
    # The server takes the model's values from `config` itself (verification of a written file);
    # otherwise each candidate's values are swapped into a copy of it.
    from_file: bool = False
    remeasure_near_slo: bool = True  # a point in the noise band of the SLO is measured again (NOISE_BAND)
    archive: str = ""  # the variant's archive file in model_store (build/variants.py); "": the default
    device: str = "cpu"  # cuda: the server's workers on one GPU (number_of_gpu=1); cpu: none on a GPU


class ServedMeasurer:
    """Open-loop points for candidates, each on its own TorchServe (one server at a time).

    Use as a context manager: whatever happens, the last server is stopped on exit.
    """

    def __init__(self, plan: ServePlan, progress: Progress = print) -> None:
        self.plan = plan
        self.progress = progress
        self._server: Optional[TorchServe] = None
        self._candidate: Optional[Candidate] = None
        self._pending_s = 0.0  # stop time of the last server, charged to the next start
        self.worker_threads: dict[str, tuple] = {}
        self.conditions: list[dict] = []  # the machine at every server start (measurement hygiene)
        self.budget: Optional[Budget] = None  # the run's time budget: re-measuring near the SLO stays within it

    def __enter__(self) -> ServedMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def finish(self) -> None:
        """Stop the current server (its stop time is charged to the next server's start)."""
        server, self._server, self._candidate = self._server, None, None
        if server is not None:
            began = time.perf_counter()
            server.__exit__(None, None, None)
            self._pending_s += time.perf_counter() - began

    def _start(self, candidate: Candidate) -> float:
        self.finish()
        if self.plan.wait_quiet_s > 0:  # not measurement time: waited before the clock starts
            state = resources.wait_for_quiet(self.plan.wait_quiet_s, self.progress)
        else:
            state = resources.machine_conditions()
        began = time.perf_counter()
        self.conditions.append({"candidate": candidate.key, **state})
        others = f", other TorchServe pids {state['other_torchserve_pids']}" if state["other_torchserve_pids"] else ""
        self.progress(f"  starting TorchServe: {candidate.label} (load average {state['load_average'][0]}{others})")
        plan = self.plan
        models = {} if plan.from_file else {plan.model: candidate.settings(plan.response_timeout_s)}
        archives = {plan.model: plan.archive} if plan.archive and not plan.from_file else {}
        server = TorchServe(plan.model_store, base_config=plan.config, models=models, load=(plan.model,),
                            archives=archives, extra_properties={**METRICS_PROPERTIES, **device_properties(plan.device)})
        # Entered as a context (left in finish()): the launcher then turns SIGTERM into a clean stop.
        server.__enter__()
        self._server, self._candidate = server, candidate
        threads = runner.worker_threads(server, plan.model)
        self.worker_threads[candidate.key] = threads
        if threads and set(threads) != {candidate.threads}:
            self.progress(f"  warning: workers report {threads} threads, the candidate assumes {candidate.threads}")
        target, payloads = self._target()
        in_flight = min(plan.load.connections, 2 * candidate.workers * candidate.batch_size)
        runner.warm_up(target, payloads, plan.load.warmup_s, max(2, in_flight))
        spent = time.perf_counter() - began + self._pending_s
        self._pending_s = 0.0
        return spent

    @property
    def server(self) -> Optional[TorchServe]:
        return self._server

    def _target(self):
        server = self._server
        target = loadgen.Target.for_model(server.inference_url, self.plan.model, server.tokens.inference,
                                          timeout_s=float(self.plan.response_timeout_s))
        return target, loadgen.payloads_for(self.plan.model)

    def measure(self, phase: str, candidate: Candidate, rate: float) -> Point:
        overhead = self._start(candidate) if self._candidate != candidate else 0.0
        point = self._measure(candidate, rate, overhead)
        if self.plan.wait_quiet_s > 0 and self._disturbed(point):
            # Another job took CPU from under a point that failed near the SLO: the failure may be
            # theirs. Wait for quiet and measure it once more (both runs count as time spent).
            self.progress(f"  other processes used {point.others_cpu_pct:.0f}% CPU during that point: "
                          "waiting for quiet, then measuring it again")
            resources.wait_for_quiet(self.plan.wait_quiet_s, self.progress, ours=[self._server.java_pid or -1])
            again = self._measure(candidate, rate, overhead)
            point = replace(again, seconds=round(again.seconds + point.seconds, 2))
        if self.plan.remeasure_near_slo and self._near_slo(point) and self._may_remeasure(point, candidate, rate):
            # Passes and misses alike: measuring again only the points that just failed would give
            # every near miss a second chance and no near pass a second look, biasing the search up.
            self.progress(f"  the p99 lies within {NOISE_BAND:g}x of the SLO ({self.plan.slo_ms:g} ms), either side: "
                          f"measuring {REMEASUREMENTS} more times, the median p99 decides")
            again = [self._measure(candidate, rate, 0.0) for _ in range(REMEASUREMENTS)]
            point = median_point([point, *again])
            self.progress(f"  the median: {stats.tail_text(point.latency)} "
                          f"({'passes' if point.passes(self.plan.slo_ms) else 'fails'})")
        return point

    def _may_remeasure(self, point: Point, candidate: Candidate, rate: float) -> bool:
        """Whether the budget (if any) leaves the time to measure a point again REMEASUREMENTS times."""
        what = f"re-measuring {candidate.label} at {rate:.1f} req/s near the SLO"
        if self.budget is None or self.budget.allows(what, REMEASUREMENTS * point.seconds):
            return True
        self.progress("  the p99 lies near the SLO, but the time budget leaves no room to measure it again: it stands")
        return False

    def _near_slo(self, point: Point) -> bool:
        """A p99 within NOISE_BAND of the SLO, either side, with every request answered at the
        offered rate (a point failing on errors or falling behind is no question of noise)."""
        slo = self.plan.slo_ms
        return (point.p99_ms is not None and slo / NOISE_BAND <= point.p99_ms <= NOISE_BAND * slo
                and point.errors == 0 and kept_up(point.achieved_rps, point.offered_rps))

    def _disturbed(self, point: Point) -> bool:
        """Noise only ever slows a server down: a point that passed under it stands, and so does
        one far past the SLO (its own traffic's kernel time then counts as "others" too)."""
        if point.others_cpu_pct is None or point.others_cpu_pct <= NOISY_OTHERS_PCT:
            return False
        near = point.p99_ms is not None and point.p99_ms < 4 * self.plan.slo_ms and \
            point.achieved_rps >= 0.8 * point.offered_rps
        return near and not point.passes(self.plan.slo_ms)

    def _measure(self, candidate: Candidate, rate: float, overhead: float) -> Point:
        server = self._server
        target, payloads = self._target()
        groups = resources.ProcessGroups.for_server(server.java_pid, server.worker_pids(self.plan.model))

        def probe():
            return server_metrics.Scrape.of(server.metrics_text()), groups.read()

        self.progress(f"  open loop at {rate:.1f} req/s")
        began = time.perf_counter()
        window_s = self.plan.load.window_at(rate)
        result = loadgen.open_loop(target, payloads, rate, self.plan.load.rule, window_s,
                                   self.plan.load.connections, seed=int(rate * 1000) % 2**31,
                                   drain_s=max(5.0, 2 * window_s), probe=probe,
                                   progress=lambda line: self.progress(f"  {line.strip()}"))
        point = point_from(result, self.plan.model, candidate, time.perf_counter() - began, overhead)
        others = "" if point.others_cpu_pct is None else f", other processes {point.others_cpu_pct:.0f}% CPU"
        self.progress(f"  {rate:.1f} req/s offered: {point.achieved_rps:.1f} served, {stats.tail_text(point.latency)}, "
                      f"{point.errors} errors, mean batch {point.mean_batch or 0:.2f}{others}")
        return point


def median_by(items: Sequence[T], key: Callable[[T], float]) -> T:
    """The middle item by `key`, whole (of an even count, the lower middle)."""
    return sorted(items, key=key)[(len(items) - 1) // 2]


def median_point(points: Sequence[Point]) -> Point:
    """The measurement with the median p99 (no p99 counts as the worst), whole: its throughput,
    errors and stability come with it. Its time is every measurement's; its start overhead the first's."""
    chosen = median_by(points, lambda p: float("inf") if p.p99_ms is None else p.p99_ms)
    return replace(chosen, seconds=round(sum(p.seconds for p in points), 2), overhead_s=points[0].overhead_s,
                   remeasured_p99_ms=tuple(p.p99_ms for p in points))
