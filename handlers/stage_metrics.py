"""Per-batch stage timings and formed batch sizes, emitted through the engine's metrics sink.

Counters (cumulative milliseconds, batches per size) so a scraper can diff two readings of the
Prometheus endpoint and get exact means over any window; a gauge would only keep the last batch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from handlers.engines import model_dims

STAGES = ("preprocess", "inference", "postprocess")
STAGE_METRIC = {stage: f"Handler{stage.capitalize()}Ms" for stage in STAGES}
BATCHES_METRIC = "HandlerBatches"
ITEMS_METRIC = "HandlerItems"
DEADLINE_EXPIRED_METRIC = "HandlerDeadlineExpired"
DEADLINE_LATE_METRIC = "HandlerDeadlineLate"


@dataclass
class StageClock:
    """Times the stages of one batch."""

    elapsed_ms: dict[str, float] = field(default_factory=dict)

    def start(self) -> float:
        return time.perf_counter()

    def stop(self, stage: str, started: float) -> None:
        self.elapsed_ms[stage] = (time.perf_counter() - started) * 1000.0

    def mark(self, point: str) -> None:
        """A moment inside a stage that only traces use: nothing to do for the metrics."""


@dataclass
class TracedClock(StageClock):
    """A StageClock that also keeps each stage's (start, end) and the marked moments, on
    time.perf_counter(): what handlers/tracing.py makes spans from. Used only while tracing is on."""

    spans: dict[str, tuple[float, float]] = field(default_factory=dict)
    points: dict[str, float] = field(default_factory=dict)

    def stop(self, stage: str, started: float) -> None:
        now = time.perf_counter()
        self.elapsed_ms[stage] = (now - started) * 1000.0
        self.spans[stage] = (started, now)

    def mark(self, point: str) -> None:
        self.points[point] = time.perf_counter()


def attribute_gpu_time(clock: StageClock, gpu_ms: Optional[float]) -> None:
    """On a GPU the forward returns once its kernels are launched; they finish during post-processing,
    whose first read of the outputs waits for them. The CUDA events' time beyond the launch is moved
    from postprocess to inference (the two still sum to the wall time)."""
    if gpu_ms is None or "inference" not in clock.elapsed_ms:
        return
    waited = min(max(0.0, gpu_ms - clock.elapsed_ms["inference"]), clock.elapsed_ms.get("postprocess", 0.0))
    clock.elapsed_ms["inference"] += waited
    clock.elapsed_ms["postprocess"] = clock.elapsed_ms.get("postprocess", 0.0) - waited


def emit(metrics, model_name: str, clock: StageClock, batch_size: int,
         gauges: Optional[Mapping[str, float]] = None) -> None:
    """Send one batch's figures; `metrics`: the engine's MetricsSink (handlers/engines/; None in bare
    use); `gauges`: last values to report as they are (GPU memory, handlers/device.py)."""
    if metrics is None:
        return
    dims = model_dims(model_name)
    for stage, ms in clock.elapsed_ms.items():
        metrics.time(STAGE_METRIC[stage], ms, dims)
    metrics.count(BATCHES_METRIC, 1, model_dims(model_name, ("BatchSize", str(batch_size))))
    metrics.count(ITEMS_METRIC, batch_size, dims)
    for name, value in (gauges or {}).items():
        metrics.gauge(name, value, "percent" if name.endswith("Percent") else "MB", dims)


def emit_cache(metrics, model_name: str, cache) -> None:
    """The response cache's hits, misses and evictions since the last call, and its bytes."""
    if metrics is None:
        return
    dims = model_dims(model_name)
    counts = cache.take_counts()
    for name, value in (("ResponseCacheHits", counts.hits), ("ResponseCacheMisses", counts.misses),
                        ("ResponseCacheEvictions", counts.evictions)):
        metrics.count(name, value, dims, "Count")
    metrics.gauge("ResponseCacheBytes", cache.nbytes, "Bytes", dims)


def emit_deadlines(metrics, model_name: str, deadlines) -> None:
    """Requests answered 504 because their deadline passed (per stage: not decoded, or decoded but not
    computed) and requests computed but answered after their deadline; only what happened is sent."""
    if metrics is None or not (deadlines.expired or deadlines.late):
        return
    for stage, count in deadlines.expired.items():
        metrics.count(DEADLINE_EXPIRED_METRIC, count, model_dims(model_name, ("Stage", stage)), "Count")
    if deadlines.late:
        metrics.count(DEADLINE_LATE_METRIC, deadlines.late, model_dims(model_name), "Count")
