"""OpenTelemetry traces of the request loop: off unless turned on, and free when off.

On when the worker's environment has OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT), or when
the archive's `runtime.tracing` is true; `runtime.tracing: false` keeps an archive off whatever the
environment says. TorchServe starts its workers with the frontend's environment, so the variable
set where the server starts reaches them.

One span per request (kind SERVER), a child of the caller's span when the request carries a W3C
`traceparent` header, with four children from the stage times the handler already takes for its
metrics (handlers/stage_metrics.py): decode, queue-to-batch (decoded, waiting while the batch is
collated for the forward pass), inference, encode (post-processing and the answer's bytes). They
are made after the batch with explicit start and end times, so tracing adds no work inside the
stages. Exported over OTLP/HTTP by a BatchSpanProcessor (OTEL_BSP_* and OTEL_TRACES_SAMPLER apply).

Off, this module imports nothing of OpenTelemetry and the handler pays one attribute check per batch
(and a no-op clock.mark): about 45 ns (docs/api.md, tracing).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from handlers.stage_metrics import TracedClock

log = logging.getLogger(__name__)

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
STAGE_SPANS = ("decode", "queue-to-batch", "inference", "encode")
DEFAULT_SERVICE = "torchserve"


@dataclass(frozen=True)
class TracingConfig:
    """Whether this worker traces, and under which service name: read once at initialize."""

    enabled: bool
    service_name: str = DEFAULT_SERVICE
    why: str = ""

    @classmethod
    def from_settings(cls, setting: Optional[bool], environ: Mapping[str, str]) -> TracingConfig:
        """`setting`: the archive's runtime.tracing (None: follow the environment)."""
        service = environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE
        if setting is not None:
            return cls(setting, service, f"runtime.tracing: {str(setting).lower()}")
        if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return cls(False, service, "OTEL_SDK_DISABLED=true")
        named = next((name for name in ENDPOINT_VARIABLES if environ.get(name, "").strip()), None)
        return cls(named is not None, service, f"{named} is set" if named else "no OTLP endpoint set")


@dataclass(frozen=True)
class RequestSpan:
    """What a request's span needs from the batch, gathered by the handler."""

    idx: int
    trace_headers: Mapping[str, str]  # traceparent / tracestate, as its record holds them
    outcome: str  # "served": went through every stage; "refused": rejected after decoding; "cached"
    status: int = 200
    message: str = ""


class Tracing:
    """Makes a batch's spans after the fact from the handler's StageClock."""

    def __init__(self, tracer, model_name: str, version: str) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._tracer = tracer
        self._propagator = TraceContextTextMapPropagator()
        self._attributes = {"torchserve.model": model_name, "torchserve.model_version": version}
        self._name = f"{model_name} request"

    def record_batch(self, jobs, clock: TracedClock, items: int) -> None:
        """The handler's batch (handlers/prepared.Job per request): its outcome, status and trace parent."""
        requests = [RequestSpan(job.request.index, job.request.trace_headers, job.outcome,
                                job.error.status if job.error is not None else 200,
                                job.error.message if job.error is not None else "") for job in jobs]
        try:
            self.record(requests, clock, items)
        except Exception:  # a tracing fault (an exporter's, the SDK's) must never fail the batch it describes
            log.exception("could not record a batch's spans")

    def record(self, requests: list[RequestSpan], clock: TracedClock, items: int) -> None:
        """One request span per request and its stage children, from the clock's perf_counter times."""
        to_ns = _epoch_ns()
        first = min(start for start, _ in clock.spans.values())
        last = max(end for _, end in clock.spans.values())
        stages = _stage_times(clock)
        batch = {**self._attributes, "torchserve.batch_requests": len(requests), "torchserve.batch_items": items}
        for request in requests:
            parent = self._propagator.extract(dict(request.trace_headers))
            attributes = {**batch, "torchserve.request_index": request.idx, "torchserve.outcome": request.outcome,
                          "http.response.status_code": request.status}
            span = self._tracer.start_span(self._name, context=parent, kind=self._trace.SpanKind.SERVER,
                                           start_time=to_ns(first), attributes=attributes)
            inside = self._trace.set_span_in_context(span)
            if request.outcome != "cached":
                wanted = STAGE_SPANS if request.outcome == "served" else STAGE_SPANS[:1]
                for name in wanted:
                    if name in stages:
                        start, end = stages[name]
                        self._tracer.start_span(name, context=inside, start_time=to_ns(start)).end(end_time=to_ns(end))
            if request.status >= 400:
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, request.message))
            span.end(end_time=to_ns(last))


def _stage_times(clock: TracedClock) -> dict[str, tuple[float, float]]:
    """The four stage spans from the handler's metric stages and its `decoded` moment."""
    spans, stages = clock.spans, {}
    decoded = clock.points.get("decoded")
    if decoded is not None and "preprocess" in spans:
        stages["decode"] = (spans["preprocess"][0], decoded)
        if "inference" in spans:
            stages["queue-to-batch"] = (decoded, spans["inference"][0])
    if "inference" in spans:
        stages["inference"] = spans["inference"]
    if "postprocess" in spans:
        stages["encode"] = spans["postprocess"]
    return stages


def _epoch_ns():
    """perf_counter seconds -> epoch nanoseconds, anchored once per batch."""
    now_ns, now = time.time_ns(), time.perf_counter()
    return lambda t: now_ns - int((now - t) * 1e9)


def make_tracing(config: TracingConfig, model_name: str, version: str, exporter: Any = None) -> Optional[Tracing]:
    """A Tracing for this worker, or None when off (nothing of OpenTelemetry is imported then).
    `exporter`: where spans go (tests: an InMemorySpanExporter, exported at once); default OTLP/HTTP
    to the environment's endpoint through a BatchSpanProcessor."""
    if not config.enabled:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    resource = Resource.create({"service.name": config.service_name, "torchserve.model": model_name,
                                "process.pid": os.getpid()})
    # Our own provider, not the global one: nothing else in the worker is affected. It flushes at exit.
    provider = TracerProvider(resource=resource)
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    log.info("%s: tracing on (%s), service %s", model_name, config.why, config.service_name)
    return Tracing(provider.get_tracer("handlers.tracing"), model_name, version)
