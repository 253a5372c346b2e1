"""A plan's capacity in a mix: one TorchServe with every model loaded, the mixed open loop, the
highest total rate at which every model is within its own p99 target (benchmarks.load.capacity)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from benchmarks.load import loadgen, resources, runner
from benchmarks.load.capacity import RateSettings, find_max_rate
from benchmarks.load.mix import (
    NORMALISED_SLO,
    Mix,
    MixPoint,
    mixed_payloads,
    mixed_point,
    window_for,
)
from benchmarks.load.stats import StabilityRule
from benchmarks.tune.measure import METRICS_PROPERTIES
from serving.launcher import TorchServe
from serving.ts_config import ModelSettings

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PointSettings:
    """One mixed open-loop point: each model's reported windows hold `point_requests` of its own
    arrivals (the minority model sets the length), windows at least `window_s`."""

    point_requests: int = 1000
    window_s: float = 5.0
    rule: StabilityRule = field(default_factory=lambda: StabilityRule(tolerance_pct=15.0, last=3, max_windows=4))
    connections: int = 128
    warmup_s: float = 10.0
    rates: RateSettings = RateSettings(max_points=6)

    def to_json(self) -> dict:
        return {"point_requests": self.point_requests, "window_s": self.window_s, "rule": self.rule.__dict__,
                "connections": self.connections, "warmup_s": self.warmup_s, "rates": self.rates.to_json()}


@dataclass(frozen=True)
class Capacity:
    """What one server measured: its rate search, the best passing point, worker threads and memory."""

    label: str
    points: tuple  # MixPoint, in the order measured
    best: Optional[MixPoint]
    worker_threads: Mapping[str, tuple]
    memory_mib: float
    start_s: float

    @property
    def rate_rps(self) -> float:
        return self.best.achieved_rps if self.best else 0.0

    def to_json(self) -> dict:
        return {"label": self.label, "capacity_rps": self.rate_rps,
                "best": self.best.to_json() if self.best else None,
                "points": [p.to_json() for p in self.points], "worker_threads": dict(self.worker_threads),
                "memory_mib": round(self.memory_mib, 1), "start_s": round(self.start_s, 1)}


def measure_capacity(label: str, mix: Mix, model_store: Path, config: Path, settings: Optional[dict[str, ModelSettings]],
                     start_rps: float, point: PointSettings, progress: Progress) -> Capacity:
    """Start a server from `config` (with `settings` swapped into models=, or the file as it is when
    None), warm every model up, then search the highest total rate of the mix within every SLO."""
    began = time.perf_counter()
    progress(f"[{label}] starting TorchServe (load average {resources.machine_conditions()['load_average'][0]})")
    with TorchServe(model_store, base_config=config, models=settings or {},
                    extra_properties=METRICS_PROPERTIES) as ts:
        started = time.perf_counter() - began
        threads = {m: runner.worker_threads(ts, m) for m in mix.names}
        progress(f"[{label}] up in {started:.0f} s; worker threads {threads}")
        target = loadgen.Target.for_model(ts.inference_url, mix.names[0], ts.tokens.inference, timeout_s=120.0)
        payloads = mixed_payloads(mix, {m: loadgen.payloads_for(m) for m in mix.names})
        runner.warm_up(target, payloads, point.warmup_s, concurrency=16)
        pids = [pid for m in ts.list_models() for pid in ts.worker_pids(m)]
        groups = resources.ProcessGroups.for_server(ts.java_pid, pids)
        memory = [0.0]

        def probe(rate: float) -> MixPoint:
            window = window_for(mix, rate, point.window_s, point.point_requests, point.rule.last)
            progress(f"[{label}] mix at {rate:.1f} req/s ({window:.0f} s windows)")
            for model in mix.names:
                runner.settle(ts, model)
            found = mixed_point(target, mix, payloads, rate, point.rule, window, point.connections,
                                lambda line: progress(f"[{label}] {line.strip()}"))
            reading = groups.read()
            memory[0] = max(memory[0], (reading.rss_bytes[resources.FRONTEND] + reading.rss_bytes[resources.WORKERS]) / 2**20)
            progress(f"[{label}]   {found.describe()}{'' if found.passes() else '  (fails)'}")
            return found

        search = find_max_rate(probe, start_rps, NORMALISED_SLO, point.rates)
    best = f"{search.best.achieved_rps:.1f} req/s" if search.best else "no rate"
    progress(f"[{label}] capacity in the mix: {best} ({len(search.points)} points)")
    return Capacity(label, search.points, search.best, threads, memory[0], started)
