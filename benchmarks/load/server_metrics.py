"""Server-side figures from TorchServe's Prometheus endpoint, as differences of two scrapes.

Only counters are used, so the difference between a scrape at the start and one at the end of a
measured interval gives exact totals for that interval:

- frontend (TorchServe 0.12, labels model_name/model_version): `ts_inference_requests_total`
  (read without `_total`), `ts_queue_latency_microseconds` (time requests waited for a worker, summed),
  `ts_inference_latency_microseconds` (time from arrival to answer, summed);
- our handlers (handlers/stage_metrics.py, labels ModelName/Level[/BatchSize]):
  `HandlerPreprocessMs`, `HandlerInferenceMs`, `HandlerPostprocessMs` (milliseconds summed over
  batches), `HandlerBatches{BatchSize=...}` (batches formed per size), `HandlerItems`.

The stock baseline handler emits none of ours: its stage figures are simply absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Optional

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]
SeriesKey = tuple[str, Labels]

STAGE_COUNTERS = {"preprocess": "HandlerPreprocessMs", "inference": "HandlerInferenceMs",
                  "postprocess": "HandlerPostprocessMs"}
BATCHES = "HandlerBatches"
ITEMS = "HandlerItems"
REQUESTS = "ts_inference_requests"
QUEUE_US = "ts_queue_latency_microseconds"
LATENCY_US = "ts_inference_latency_microseconds"


def parse(text: str) -> dict[SeriesKey, float]:
    """Prometheus text exposition -> {(name, sorted labels): value}; NaN samples skipped.

    Names lose OpenMetrics' `_total` suffix: prometheus_client's parser adds it to the samples of
    a family TYPEd counter, so without this a counter's name would depend on its TYPE line.
    """
    out: dict[SeriesKey, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.value != sample.value:  # NaN
                continue
            name = sample.name[: -len("_total")] if sample.name.endswith("_total") else sample.name
            out[(name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return out


@dataclass(frozen=True)
class Scrape:
    series: Mapping[SeriesKey, float]

    @classmethod
    def of(cls, text: str) -> Scrape:
        return cls(MappingProxyType(parse(text)))

    def total(self, name: str, model: str, **labels: str) -> float:
        """Sum of a counter over the series of one model (either label spelling) matching labels."""
        total = 0.0
        for (series, tags), value in self.series.items():
            if series != name:
                continue
            tagged = dict(tags)
            if tagged.get("model_name", tagged.get("ModelName")) != model:
                continue
            if all(tagged.get(k) == v for k, v in labels.items()):
                total += value
        return total

    def by_label(self, name: str, model: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for (series, tags), value in self.series.items():
            tagged = dict(tags)
            if series == name and tagged.get("ModelName", tagged.get("model_name")) == model and label in tagged:
                out[tagged[label]] = out.get(tagged[label], 0.0) + value
        return out


@dataclass(frozen=True)
class Breakdown:
    """What the server did for one model between two scrapes. Times are means, in ms."""

    requests: int
    queue_ms_per_request: Optional[float]
    frontend_ms_per_request: Optional[float]  # arrival -> answer, inside TorchServe
    batches: int
    items: int
    mean_batch_size: Optional[float]
    batch_sizes: Mapping[str, int]  # batch size -> batches formed
    stage_ms_per_batch: Mapping[str, float]  # preprocess / inference / postprocess
    handler_ms_per_batch: Optional[float]
    handler_ms_per_item: Optional[float]

    def to_json(self) -> dict:
        return {
            "requests": self.requests,
            "queue_ms_per_request": self.queue_ms_per_request,
            "frontend_ms_per_request": self.frontend_ms_per_request,
            "batches": self.batches,
            "items": self.items,
            "mean_batch_size": self.mean_batch_size,
            "batch_sizes": dict(self.batch_sizes),
            "stage_ms_per_batch": dict(self.stage_ms_per_batch),
            "handler_ms_per_batch": self.handler_ms_per_batch,
            "handler_ms_per_item": self.handler_ms_per_item,
        }


def _per(total: float, count: float) -> Optional[float]:
    return total / count if count > 0 else None


def breakdown(before: Scrape, after: Scrape, model: str) -> Breakdown:
    def delta(name: str, **labels: str) -> float:
        return max(0.0, after.total(name, model, **labels) - before.total(name, model, **labels))

    requests = delta(REQUESTS)
    first = before.by_label(BATCHES, model, "BatchSize")
    sizes = {size: int(round(count - first.get(size, 0.0)))
             for size, count in after.by_label(BATCHES, model, "BatchSize").items()}
    sizes = {size: n for size, n in sorted(sizes.items(), key=lambda kv: int(kv[0])) if n > 0}
    batches = sum(sizes.values())
    items = int(round(delta(ITEMS)))
    stage_totals = {stage: delta(name) for stage, name in STAGE_COUNTERS.items()}
    has_stages = batches > 0 and any(stage_totals.values())
    stages = {stage: total / batches for stage, total in stage_totals.items()} if has_stages else {}
    handler_total = sum(stage_totals.values())
    return Breakdown(
        requests=int(round(requests)),
        queue_ms_per_request=_per(delta(QUEUE_US) / 1000.0, requests),
        frontend_ms_per_request=_per(delta(LATENCY_US) / 1000.0, requests),
        batches=batches,
        items=items,
        mean_batch_size=_per(sum(int(s) * n for s, n in sizes.items()), batches),
        batch_sizes=MappingProxyType(sizes),
        stage_ms_per_batch=MappingProxyType(stages),
        handler_ms_per_batch=_per(handler_total, batches) if has_stages else None,
        handler_ms_per_item=_per(handler_total, items) if has_stages else None,
    )
