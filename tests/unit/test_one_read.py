"""The door: each request's headers and body are read from TorchServe's context once, its JSON parsed
once, whatever policies are on (response cache, tracing, deadlines); OpenAI embeddings tokenise
each text once."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from handlers import tracing
from handlers.handler import Handler
from handlers.tracing import TracingConfig

from .counting_context import CountingContext, CountingRequest, counting_json_parses

pytestmark = pytest.mark.unit

JSON_UTF8 = "application/json; charset=utf-8"  # TorchServe hands such a body over as bytes, unparsed


@pytest.fixture(scope="module")
def served(tiny_dirs):
    context = CountingContext(tiny_dirs["tiny_text"], "tiny_text", batch_size=8,
                              handler_overrides={"response_cache": {"max_mib": 1}, "runtime": {"warmup": False}})
    handler = Handler()
    handler.initialize(context)
    handler.tracing = tracing.make_tracing(TracingConfig(True), handler.model_name, handler.version,
                                           exporter=InMemorySpanExporter())
    return handler, context


def batch():
    """Every route once: plain JSON bytes, plain text, KServe v1 (bytes), OIP v2 (parsed), OpenAI embeddings."""
    requests = [
        ({"Content-Type": JSON_UTF8, "explain": "False", "url_path": "", "X-Request-Timeout-Ms": "60000",
          "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
         json.dumps({"text": "A man is eating food."}).encode()),
        ({"Content-Type": "text/plain", "explain": "False", "url_path": ""}, b"A man is eating."),
        ({"Content-Type": JSON_UTF8, "explain": "False"}, json.dumps({"instances": ["a", "b"]}).encode()),
        ({"Content-Type": "application/json", "explain": "False"},
         {"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["c"]}]}),
        ({"Content-Type": "application/json", "explain": "False", "url_path": "v1/embeddings"},
         {"model": "tiny_text", "input": ["d", "e f"]}),
    ]
    return [h for h, _ in requests], [CountingRequest(body=b) for _, b in requests]


@pytest.mark.parametrize("round_", ["first (cache misses)", "second (cache hits)"])
def test_each_request_is_read_once_and_parsed_once(served, monkeypatch, round_):
    handler, context = served
    headers, data = batch()
    context.headers, context.statuses, context.header_reads = dict(enumerate(headers)), {}, type(context.header_reads)()
    with counting_json_parses(monkeypatch) as parses:
        answers = handler.handle(data, context)
    assert not context.statuses and all(answers), context.statuses
    assert dict(context.header_reads) == {idx: 1 for idx in range(len(data))}, "header reads per request"
    assert [request.reads for request in data] == [1] * len(data), "body reads per request"
    # Two bodies arrived as JSON bytes (the plain one and the KServe v1 one): each parsed once, and only those.
    assert parses["loads"] <= 2, f"{parses['loads']} JSON parses for 2 unparsed JSON bodies"


def test_openai_embeddings_tokenise_each_text_once(served, monkeypatch):
    handler, context = served
    tokenizer = handler.family.tokenizer
    calls = []

    class Counting:
        def __getattr__(self, name):
            attr = getattr(tokenizer, name)
            if name in ("encode", "encode_batch"):
                def counted(texts, *args, **kwargs):
                    calls.append(len(texts) if name == "encode_batch" else 1)
                    return attr(texts, *args, **kwargs)
                return counted
            return attr

    monkeypatch.setattr(handler.family, "tokenizer", Counting())
    texts = ["one text", "two texts here", "three"]
    context.headers, context.statuses = {0: {"url_path": "v1/embeddings", "explain": "False"}}, {}
    (answer,) = handler.handle([{"body": {"model": "tiny_text", "input": texts}}], context)
    assert not context.statuses
    assert json.loads(answer)["usage"]["prompt_tokens"] > 0
    assert sum(calls) == len(texts), f"{sum(calls)} tokenisations for {len(texts)} texts ({calls})"
