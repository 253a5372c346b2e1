"""OpenTelemetry through a real TorchServe: OTEL_EXPORTER_OTLP_ENDPOINT set where the server starts
reaches its workers (TorchServe hands them the frontend's environment), each request's span and its
stage children arrive at a local OTLP/HTTP receiver, in the trace of the traceparent it was sent with."""

from __future__ import annotations

import secrets

import pytest

from benchmarks.load.inputs import requests as example_requests
from build.archive import build_entry
from build.catalogue import Catalogue
from handlers.tracing import STAGE_SPANS
from serving.launcher import TorchServe
from serving.repo import CATALOGUE, MODEL_STORE, REPO_ROOT
from serving.ts_config import ModelSettings
from tests.e2e.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.e2e

MODEL = "digits"  # small and fast: the spans are the same for every request/response family
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER
SERVICE = "e2e-torchserve"


@pytest.fixture(scope="module")
def traced_server():
    build_entry(Catalogue.load(CATALOGUE), MODEL, REPO_ROOT, MODEL_STORE, progress=print)
    settings = {MODEL: ModelSettings(batch_size=4, max_batch_delay_ms=20, min_workers=1, max_workers=1)}
    with OtlpReceiver() as receiver:
        # A short export delay: spans leave the worker within 0.1 s instead of the default 5 s.
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
               "OTEL_SERVICE_NAME": SERVICE}
        with TorchServe(MODEL_STORE, models=settings, load=(MODEL,), env=env) as server:
            yield server, receiver


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def requests_of(trace_ids: set[str]):
    def done(spans: list[ReceivedSpan]) -> bool:
        found = {s.trace_id for s in spans if s.kind == SERVER_KIND} & trace_ids
        children = [s for s in spans if s.trace_id in trace_ids and s.name in STAGE_SPANS]
        return found == trace_ids and len(children) >= len(STAGE_SPANS) * len(trace_ids)
    return done


def test_spans_arrive_in_the_callers_trace_with_their_stages(traced_server) -> None:
    server, receiver = traced_server
    example = example_requests(MODEL)[0]
    sent = [traceparent() for _ in range(3)]
    for _, _, header in sent:
        answer = server.predict(MODEL, example.body, example.content_type, headers={"traceparent": header})
        assert answer.status_code == 200, answer.text
    spans = receiver.wait_for(requests_of({trace_id for trace_id, _, _ in sent}))
    for trace_id, caller, _ in sent:
        mine = [s for s in spans if s.trace_id == trace_id]
        (request,) = [s for s in mine if s.kind == SERVER_KIND]
        assert request.name == f"{MODEL} request" and request.parent_span_id == caller
        assert request.attributes["torchserve.model"] == MODEL
        assert request.attributes["http.response.status_code"] == 200
        assert request.resource["service.name"] == SERVICE
        stages = sorted((s for s in mine if s.parent_span_id == request.span_id), key=lambda s: s.start_ns)
        assert [s.name for s in stages] == list(STAGE_SPANS)
        assert request.start_ns <= stages[0].start_ns and stages[-1].end_ns <= request.end_ns
        assert all(s.end_ns >= s.start_ns for s in stages)


def test_a_request_without_traceparent_starts_its_own_trace(traced_server) -> None:
    server, receiver = traced_server
    example = example_requests(MODEL)[0]
    before = {s.span_id for s in receiver.spans}
    assert server.predict(MODEL, example.body, example.content_type).status_code == 200

    def new_root(spans: list[ReceivedSpan]) -> bool:
        return any(s.kind == SERVER_KIND and not s.parent_span_id and s.span_id not in before for s in spans)

    spans = receiver.wait_for(new_root)
    (root,) = [s for s in spans if s.kind == SERVER_KIND and not s.parent_span_id and s.span_id not in before]
    assert sorted(s.name for s in spans if s.parent_span_id == root.span_id) == sorted(STAGE_SPANS)
