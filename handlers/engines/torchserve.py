"""TorchServe 0.12's adapter: the only module that knows its context, its request shapes, its
headers, its metrics API and its streaming call (handlers/engines/__init__.py says what an adapter is).

- A batch arrives as `data` (one dict per request: the body under "data" or "body", or the fields of
  a form) and a context holding each request's headers (`get_all_request_header(idx)`) and id.
- An answer's status and reason phrase (`set_response_status`), content type and headers are set on
  the context per request index. TorchServe's worker writes a phrase's length in characters and its
  bytes in UTF-8: a phrase must be one printable ASCII line or the frontend desynchronises.
- A request without the `explain` header the REST routes add came over gRPC: TorchServe 0.12's
  frontend reads `ts_stream_next` on every answer to gRPC StreamPredictions and, when it is absent,
  fails the worker and every request of its batch. REST answers must not carry it (the frontend
  would send them as an unfinished stream).
- Metrics go to `context.metrics` (ts.metrics dimensions and types), streamed chunks through
  `ts.handler_utils.utils.send_intermediate_predict_response`; both imported only when used. The
  async mode's chunks of one engine step, to requests of several contexts, go as one message
  (`send_step`, over batch_context.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional

from handlers.deadlines import Arrival
from handlers.engines import Dimensions, Worker
from handlers.engines.batch_context import BatchContext
from handlers.errors import BadInput, HandlerError
from handlers.protocols import Reply
from handlers.request import Request, open_request

STREAM_NEXT = "ts_stream_next"
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")


def status_phrase(message: str) -> str:
    """A reason phrase TorchServe's worker can send: one printable ASCII line (see the module's docstring)."""
    return _UNPRINTABLE.sub(" ", message)[:200].strip() or "error"


def request_body(request: Any) -> Any:
    """The payload of one request as TorchServe passes it: raw body, or a single form field."""
    if not isinstance(request, dict):
        return request
    for key in ("data", "body"):
        if key in request:
            return request[key]
    if len(request) == 1:
        return next(iter(request.values()))
    raise BadInput("send the input as the request body (or a single form field named 'data')")


def _headers(context, idx: int) -> Mapping[str, Any]:
    try:
        return context.get_all_request_header(idx) or {}
    except (AttributeError, IndexError, KeyError, TypeError):  # contexts without request headers
        return {}


class TorchServeMetrics:
    """context.metrics as a MetricsSink."""

    def __init__(self, metrics) -> None:
        self.metrics = metrics

    @staticmethod
    def _dims(dims: Dimensions) -> list:
        from ts.metrics.dimension import Dimension

        # Fresh lists: TorchServe appends its default dimensions to the list it is given.
        return [Dimension(name, value) for name, value in dims]

    def time(self, name: str, ms: float, dims: Dimensions) -> None:
        from ts.metrics.metric_type_enum import MetricTypes

        self.metrics.add_time(name, ms, dimensions=self._dims(dims), metric_type=MetricTypes.COUNTER)

    def count(self, name: str, value: float, dims: Dimensions, unit: Optional[str] = None) -> None:
        from ts.metrics.metric_type_enum import MetricTypes

        if unit is None:
            self.metrics.add_counter(name, value, dimensions=self._dims(dims))
        else:
            self.metrics.add_metric(name, value, unit, dimensions=self._dims(dims), metric_type=MetricTypes.COUNTER)

    def gauge(self, name: str, value: float, unit: str, dims: Dimensions) -> None:
        from ts.metrics.metric_type_enum import MetricTypes

        self.metrics.add_metric(name, value, unit, dimensions=self._dims(dims), metric_type=MetricTypes.GAUGE)


class TorchServe:
    """The engine adapter for TorchServe 0.12 (stateless: one per worker)."""

    name = "torchserve"

    @staticmethod
    def worker(context) -> Worker:
        props = context.system_properties
        manifest = getattr(context, "manifest", None) or {}
        gpu_id = props.get("gpu_id")
        return Worker(model_name=context.model_name, model_dir=Path(props["model_dir"]),
                      version=str((manifest.get("model") or {}).get("modelVersion", "1.0")),
                      gpu_id=None if gpu_id is None else int(gpu_id),
                      max_batch_size=int(props.get("batch_size") or 1),
                      model_config=MappingProxyType(dict(getattr(context, "model_yaml_config", None) or {})))

    @staticmethod
    def requests(data: Sequence[Any], context, default_deadline_ms: Optional[int] = 0,
                 indices: Optional[Sequence[int]] = None) -> list[Request]:
        """The batch's records: each request's headers and body read once (`default_deadline_ms`: the
        model's, None to read no deadlines; `indices`: where each of `data` sits in the context)."""
        arrival = Arrival.now()
        ids = getattr(context, "request_ids", None) or {}
        records = []
        for raw, idx in zip(data, range(len(data)) if indices is None else indices):
            try:
                body, error = request_body(raw), None
            except HandlerError as err:
                body, error = None, err
            records.append(open_request(idx, ids.get(idx), _headers(context, idx), body, arrival,
                                        default_deadline_ms, error))
        return records

    @staticmethod
    def reply(context, requests: Sequence[Request], replies: Sequence[Optional[Reply]]) -> list[Optional[bytes]]:
        """Each request's reply written into the context; the bodies, in the batch's order."""
        bodies = []
        for request, answer in zip(requests, replies):
            if answer is not None:
                TorchServe.write(context, request.index, answer)
            TorchServe.close(context, request)
            bodies.append(None if answer is None else answer.body)
        return bodies

    @staticmethod
    def write(context, idx: int, answer: Reply) -> None:
        """One reply's status (when not 200), content type and headers."""
        if answer.status != 200:
            context.set_response_status(answer.status, status_phrase(answer.message), idx)
        if answer.content_type:
            context.set_response_content_type(idx, answer.content_type)
        for name, value in answer.headers.items():  # the binary tensor extension's Inference-Header-Content-Length
            context.set_response_header(idx, name, value)

    @staticmethod
    def close(context, request: Request) -> None:
        """A gRPC request's answer marked as its last (see the module's docstring)."""
        if request.rest:
            return
        try:
            if STREAM_NEXT not in (context.get_response_headers(request.index) or {}):
                context.set_response_header(request.index, STREAM_NEXT, "false")
        except (AttributeError, IndexError, KeyError):  # a context that keeps no response headers
            return

    @staticmethod
    def metrics(context) -> Optional[TorchServeMetrics]:
        metrics = getattr(context, "metrics", None)
        return None if metrics is None else TorchServeMetrics(metrics)

    @staticmethod
    def send_intermediate(context, chunks: dict[int, bytes]) -> None:
        """Chunks sent ahead of the answers (one message for the batch's requests that have one)."""
        from ts.handler_utils.utils import send_intermediate_predict_response

        ids = {idx: context.request_ids[idx] for idx in chunks}
        send_intermediate_predict_response(chunks, ids, "Intermediate Prediction success", 200, context)

    @staticmethod
    def send_step(parts: Sequence[tuple[Any, Request, Reply]]) -> None:
        """One engine step's chunks, to requests that came in several contexts (TorchServe's async
        mode gives every request its own), as one message: each chunk's content type set first."""
        batch = BatchContext([(context, request.index) for context, request, _ in parts])
        for n, (_, _, chunk) in enumerate(parts):
            if chunk.content_type:
                batch.set_response_content_type(n, chunk.content_type)
        TorchServe.send_intermediate(batch, {n: chunk.body for n, (_, _, chunk) in enumerate(parts)})
