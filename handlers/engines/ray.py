"""Ray Serve's adapter: the only module of the handler package that knows Ray (handlers/engines/__init__.py
says what an adapter is). It imports nothing of Ray, so the package imports
without Ray installed.

A replica (serving/ray/app.py) owns the HTTP side: it reads each request's headers and body once, at
its door (`open_http`), into a `Request` record whose route comes from the URL it was sent to, not from
headers an engine added. A batch reaches `Handler.handle` as those records and a `RayContext`; the
same batch loop TorchServe's path runs answers them, and `reply` hands back one `Reply` per request
(status, content type, headers, body) for the replica to send.

Metrics go to Ray's own metrics (`ray.serve.metrics`): every node's agent exports them for Prometheus
with Serve's application, deployment and replica tags beside ours, so they add up over replicas and
nodes without a scrape per replica. Ray's exporter lowercases a name, prefixes `ray_` and ends a
counter in `_total`, so a name is given to Ray in snake case (HandlerBatches: ray_handler_batches_total).
The replica hands the sink Ray's metrics module: nothing here imports Ray.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from handlers.deadlines import Arrival
from handlers.engines import Dimensions, MetricsSink, Worker
from handlers.errors import ServerFault
from handlers.protocols import Reply
from handlers.request import KSERVE, OPENAI, PLAIN, Request, is_openai_path, open_request

ROUTES = (PLAIN, KSERVE, OPENAI)


@dataclass(frozen=True)
class RayContext:
    """What a replica hands the handler: its start-up facts and its metrics sink (one per replica)."""

    worker: Worker
    metrics: Optional[MetricsSink] = None


def decode_body(body: bytes, media_type: str) -> Any:
    """A body as TorchServe's worker passes it on (so both engines give a family the same value):
    `application/json` parsed, `text/*` as text, else bytes; what does not decode (nested past
    Python's limit included) stays bytes, for the family to refuse by name."""
    try:
        if media_type == "application/json":
            return json.loads(body.decode("utf-8"))
        if media_type.startswith("text"):
            return body.decode("utf-8")
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return body
    return body


def open_http(headers: Mapping[Any, Any], body: bytes, route: str, url_path: str, request_id: Optional[str],
              default_deadline_ms: Optional[int], arrival: Optional[Arrival] = None) -> Request:
    """The record of one HTTP request, as it came in: `route` from its URL (PLAIN, KSERVE or OPENAI, the
    latter from a `url_path` under `v1/`), `url_path` what followed /predictions/<model>[/<version>]/."""
    if route not in ROUTES:
        raise ValueError(f"route {route!r} is not one of {ROUTES}")
    url_path = url_path.strip("/")
    if route == PLAIN and is_openai_path(url_path):
        route = OPENAI
    media_type = str(dict((str(k).lower(), v) for k, v in headers.items()).get("content-type", ""))
    media_type = media_type.split(";")[0].strip().lower()
    record = open_request(0, request_id, headers, decode_body(body, media_type), arrival or Arrival.now(),
                          default_deadline_ms)
    return dataclasses.replace(record, route=route, url_path=url_path, rest=True)


def ray_name(name: str) -> str:
    """A sink name as Ray is given it: snake case (HandlerPreprocessMs: handler_preprocess_ms;
    GPUMemoryPeakMiB: gpu_memory_peak_mib)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name.replace("MiB", "Mib")).lower()


class RayMetrics:
    """ray.serve.metrics as a MetricsSink: one Ray metric per name, created on first use with the
    dimension names it is first given as its tag keys."""

    def __init__(self, metrics: Any) -> None:
        """`metrics`: the module `ray.serve.metrics`, handed in by the replica (this package never imports Ray)."""
        self.ray_metrics = metrics
        self._metrics: dict[str, Any] = {}

    def _metric(self, kind: str, name: str, dims: Dimensions, unit: Optional[str]) -> Any:
        metric = self._metrics.get(name)
        if metric is None:
            description = f"{name} ({unit})" if unit else name
            metric = getattr(self.ray_metrics, kind)(ray_name(name), description=description,
                                                     tag_keys=tuple(k for k, _ in dims))
            self._metrics[name] = metric
        return metric

    def time(self, name: str, ms: float, dims: Dimensions) -> None:
        self._metric("Counter", name, dims, "ms").inc(ms, tags=dict(dims))

    def count(self, name: str, value: float, dims: Dimensions, unit: Optional[str] = None) -> None:
        if value:
            self._metric("Counter", name, dims, unit).inc(value, tags=dict(dims))

    def gauge(self, name: str, value: float, unit: str, dims: Dimensions) -> None:
        self._metric("Gauge", name, dims, unit).set(value, tags=dict(dims))


class Ray:
    """The engine adapter for Ray Serve (stateless: the replica holds the context)."""

    name = "ray"

    @staticmethod
    def worker(context: RayContext) -> Worker:
        return context.worker

    @staticmethod
    def requests(data: Sequence[Any], context: RayContext, default_deadline_ms: Optional[int] = 0,
                 indices: Optional[Sequence[int]] = None) -> list[Request]:
        """The batch's records, built at the replica's door; each placed at its index in the batch."""
        places = range(len(data)) if indices is None else indices
        return [record if record.index == idx else dataclasses.replace(record, index=idx)
                for record, idx in zip(data, places)]

    @staticmethod
    def reply(context: RayContext, requests: Sequence[Request], replies: Sequence[Optional[Reply]]) -> list[Reply]:
        """One Reply per request, in the batch's order (a request the loop left unanswered: our 500)."""
        missing = ServerFault("the handler gave this request no answer (the replica log has the traceback)")
        return [reply if reply is not None else Reply(b"", status=missing.status, message=missing.message)
                for reply in replies]

    @staticmethod
    def write(context: RayContext, idx: int, answer: Reply) -> None:
        """Nothing to write: a reply travels back as the value `reply` returns."""

    @staticmethod
    def metrics(context: RayContext) -> Optional[MetricsSink]:
        return context.metrics

    @staticmethod
    def send_intermediate(context: RayContext, chunks: dict[int, bytes]) -> None:
        raise ServerFault("streaming is served by the generation deployment on Ray, not by the batch loop")
