"""Per-batch stage timings and formed batch sizes, emitted through TorchServe's context.metrics.

Counters (cumulative milliseconds, batches per size) so a scraper can diff two readings of the
Prometheus endpoint and get exact means over any window; a gauge would only keep the last batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

STAGES = ("preprocess", "inference", "postprocess")
STAGE_METRIC = {stage: f"Handler{stage.capitalize()}Ms" for stage in STAGES}
BATCHES_METRIC = "HandlerBatches"
ITEMS_METRIC = "HandlerItems"


@dataclass
class StageClock:
    """Times the stages of one batch: each stage's (start, end) on time.perf_counter(). The ends,
    not only the lengths, so that traces (handlers/tracing.py) can be made from them afterwards.
    A stage that is not a metric (``decode``, the first part of ``preprocess``) is kept for traces only."""

    marks: dict[str, tuple[float, float]] = field(default_factory=dict)

    def start(self) -> float:
        return time.perf_counter()

    def stop(self, stage: str, started: float) -> None:
        self.marks[stage] = (started, time.perf_counter())

    @property
    def elapsed_ms(self) -> dict[str, float]:
        """Milliseconds per metric stage."""
        return {stage: (end - start) * 1000.0 for stage, (start, end) in self.marks.items() if stage in STAGE_METRIC}


def emit(metrics, model_name: str, clock: StageClock, batch_size: int) -> None:
    """Send one batch's figures; ``metrics`` is TorchServe's context.metrics (None in bare use)."""
    if metrics is None:
        return
    from ts.metrics.dimension import (
        Dimension,  # TorchServe-only import, kept off the import path
    )
    from ts.metrics.metric_type_enum import MetricTypes

    def dims(*extra):
        # Fresh lists: TorchServe appends its default dimensions to the list it is given.
        return [Dimension("ModelName", model_name), Dimension("Level", "Model"), *extra]

    for stage, ms in clock.elapsed_ms.items():
        metrics.add_time(STAGE_METRIC[stage], ms, dimensions=dims(), metric_type=MetricTypes.COUNTER)
    metrics.add_counter(BATCHES_METRIC, 1, dimensions=dims(Dimension("BatchSize", str(batch_size))))
    metrics.add_counter(ITEMS_METRIC, batch_size, dimensions=dims())


def emit_cache(metrics, model_name: str, cache) -> None:
    """The response cache's hits, misses and evictions since the last call, and its bytes."""
    if metrics is None:
        return
    from ts.metrics.dimension import Dimension
    from ts.metrics.metric_type_enum import MetricTypes

    counts = cache.take_counts()
    for name, value in (("ResponseCacheHits", counts.hits), ("ResponseCacheMisses", counts.misses),
                        ("ResponseCacheEvictions", counts.evictions)):
        metrics.add_metric(name, value, "Count", dimensions=[Dimension("ModelName", model_name),
                                                             Dimension("Level", "Model")],
                           metric_type=MetricTypes.COUNTER)
    metrics.add_metric("ResponseCacheBytes", cache.nbytes, "Bytes",
                       dimensions=[Dimension("ModelName", model_name), Dimension("Level", "Model")],
                       metric_type=MetricTypes.GAUGE)
