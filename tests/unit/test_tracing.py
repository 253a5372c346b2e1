"""OpenTelemetry tracing (handlers/tracing.py) in-process on the tiny tensor model with the fake
context and the SDK's in-memory exporter: one span per request with its stage children, a client's
traceparent carried, refused and cached requests told apart, and nothing at all when off."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from build.examples import worker_input
from handlers import tracing
from handlers.errors import ConfigError
from handlers.settings import RuntimeSettings, parse_section
from handlers.tracing import STAGE_SPANS, TracingConfig
from serving.repo import REPO_ROOT

from .conftest import make_handler

pytestmark = pytest.mark.unit

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
SCAN = json.dumps({"inputs": np.arange(16, dtype=np.float32).reshape(1, 4, 4).tolist()}).encode()
BAD = json.dumps({"inputs": "not numbers"}).encode()
ENDPOINT = "http://127.0.0.1:4318"


def traced_handler(tiny_dirs, **overrides):
    handler, context = make_handler(tiny_dirs["tiny_tensor"], "tiny_tensor", runtime={"warmup": False}, **overrides)
    exporter = InMemorySpanExporter()
    handler.tracing = tracing.make_tracing(TracingConfig(True), handler.model_name, handler.version, exporter=exporter)
    return handler, context, exporter


@pytest.fixture(scope="module")
def traced(tiny_dirs):
    return traced_handler(tiny_dirs)


def run_batch(handler, context, bodies, headers=None):
    headers = headers or [{} for _ in bodies]
    context.headers = {i: {"Content-Type": "application/json", **h} for i, h in enumerate(headers)}
    context.statuses = {}
    return handler.handle([{"body": worker_input(b, "application/json")} for b in bodies], context)


def by_parent(spans):
    requests = [s for s in spans if s.name == "tiny_tensor request"]
    children = {r.context.span_id: [s for s in spans if s.parent is not None and s.parent.span_id == r.context.span_id]
                for r in requests}
    return requests, children


@pytest.mark.parametrize("setting, environ, enabled", [
    (None, {}, False),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True),
    (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{ENDPOINT}/v1/traces"}, True),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False),
    (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, False),
    (True, {}, True),
])
def test_on_from_the_environment_or_the_setting(setting, environ, enabled) -> None:
    config = TracingConfig.from_settings(setting, environ)
    assert config.enabled is enabled and config.why
    assert config.service_name == "torchserve"
    assert TracingConfig.from_settings(setting, {**environ, "OTEL_SERVICE_NAME": "mix"}).service_name == "mix"


@pytest.mark.parametrize("value", ["yes", 1, "on"])
def test_the_setting_is_validated(value) -> None:
    with pytest.raises(ConfigError, match="runtime.tracing: expected bool"):
        parse_section(RuntimeSettings, {"tracing": value}, "handler.runtime")
    assert parse_section(RuntimeSettings, {"tracing": True}, "handler.runtime").tracing is True
    assert RuntimeSettings().tracing is None


def test_one_span_per_request_with_its_stages_and_the_callers_trace(traced) -> None:
    handler, context, exporter = traced
    exporter.clear()
    answers = run_batch(handler, context, [SCAN, SCAN], [{"traceparent": TRACEPARENT}, {}])
    assert len(answers) == 2 and not context.statuses
    spans = exporter.get_finished_spans()
    requests, children = by_parent(spans)
    assert len(requests) == 2 and len(spans) == 2 + 2 * len(STAGE_SPANS)
    first, second = sorted(requests, key=lambda s: s.attributes["torchserve.request_index"])
    # The client's traceparent: same trace, the caller's span as parent.
    assert format(first.context.trace_id, "032x") == TRACE_ID
    assert format(first.parent.span_id, "016x") == CALLER_SPAN and first.parent.is_remote
    # No traceparent: a trace of its own.
    assert second.parent is None and format(second.context.trace_id, "032x") != TRACE_ID
    for request in (first, second):
        assert request.kind == SpanKind.SERVER
        assert request.attributes["torchserve.batch_requests"] == 2
        assert request.attributes["http.response.status_code"] == 200
        assert request.attributes["torchserve.outcome"] == "served"
        stages = sorted(children[request.context.span_id], key=lambda s: s.start_time)
        assert [s.name for s in stages] == list(STAGE_SPANS)
        assert all(s.context.trace_id == request.context.trace_id for s in stages)
        # In order, inside the request's span, each one ending before the next starts.
        assert request.start_time <= stages[0].start_time
        for before, after in zip(stages, stages[1:]):
            assert before.start_time <= before.end_time <= after.start_time
        assert stages[-1].end_time <= request.end_time


def test_a_refused_request_has_an_error_and_only_its_decode(traced) -> None:
    handler, context, exporter = traced
    exporter.clear()
    run_batch(handler, context, [BAD, SCAN], [{"traceparent": TRACEPARENT}, {}])
    assert context.statuses[0][0] == 400
    requests, children = by_parent(exporter.get_finished_spans())
    refused = next(r for r in requests if r.attributes["torchserve.request_index"] == 0)
    served = next(r for r in requests if r.attributes["torchserve.request_index"] == 1)
    assert refused.status.status_code == StatusCode.ERROR and refused.attributes["http.response.status_code"] == 400
    assert refused.attributes["torchserve.outcome"] == "refused"
    assert [s.name for s in children[refused.context.span_id]] == ["decode"]
    assert sorted(s.name for s in children[served.context.span_id]) == sorted(STAGE_SPANS)


def test_traceparent_as_bytes_is_carried(traced) -> None:
    """TorchServe may hand header values over as bytes."""
    handler, context, exporter = traced
    exporter.clear()
    run_batch(handler, context, [SCAN], [{"Traceparent": TRACEPARENT.encode()}])
    (request,), _ = by_parent(exporter.get_finished_spans())
    assert format(request.context.trace_id, "032x") == TRACE_ID


def test_a_cached_answer_has_a_span_without_stages(tiny_dirs) -> None:
    handler, context, exporter = traced_handler(tiny_dirs, response_cache={"max_mib": 1})
    run_batch(handler, context, [SCAN])
    exporter.clear()
    run_batch(handler, context, [SCAN], [{"traceparent": TRACEPARENT}])
    (request,), children = by_parent(exporter.get_finished_spans())
    assert request.attributes["torchserve.outcome"] == "cached" and not children[request.context.span_id]
    assert format(request.context.trace_id, "032x") == TRACE_ID


def test_a_tracing_fault_never_fails_the_batch(tiny_dirs, monkeypatch) -> None:
    handler, context, _ = traced_handler(tiny_dirs)

    def broken(*args, **kwargs):
        raise RuntimeError("exporter down")

    monkeypatch.setattr(handler.tracing, "record", broken)
    answers = run_batch(handler, context, [SCAN, SCAN])
    assert len(answers) == 2 and all(a is not None for a in answers) and not context.statuses


def test_off_no_span_and_no_opentelemetry_import(tiny_dirs) -> None:
    """A fresh interpreter without OTEL_* variables: the handler has no tracer, serves, and has
    imported nothing of OpenTelemetry."""
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from build.examples import worker_input\n"
        "from tests.inprocess import make_handler\n"
        "handler, context = make_handler(Path(sys.argv[1]), 'tiny_tensor', runtime={'warmup': False})\n"
        "assert handler.tracing is None\n"
        "body = json.dumps({'inputs': [[[0.0] * 4] * 4]}).encode()\n"
        "context.headers = {0: {'Content-Type': 'application/json', 'traceparent': sys.argv[2]}}\n"
        "assert handler.handle([{'body': worker_input(body, 'application/json')}], context)[0] is not None\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry')\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    run = subprocess.run([sys.executable, "-c", code, str(tiny_dirs["tiny_tensor"]), TRACEPARENT], cwd=REPO_ROOT,
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
