"""Worker batching (`runtime.batching: worker`, handlers/worker_batcher.py), in-process on tiny models:
each request a coroutine with its own context, as TorchServe's asynchronous worker calls the handler.

Batches close at the size limit or when the window since their first request has passed; the next
batch is decoded while the one before it is in the model; a bad request is its own 4xx and its
batch-mates are answered; answers equal the frontend-batching path's (/predictions, KServe and
OpenAI's envelopes alike); deadlines count from each request's own arrival; the response cache
answers across batches; a fault of the model fails its batch alone; the settings and the archive
keys they imply."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import zipfile

import pytest
import yaml

from benchmarks.bench.archive_settings import MANIFEST, with_handler_settings
from build.archive import build_entry
from build.catalogue import Catalogue
from handlers.async_handler import AsyncHandler
from handlers.errors import ConfigError
from handlers.families import Family
from handlers.handler import Handler
from handlers.settings import ASYNC_ENTRY, HandlerSettings
from serving.fake_context import FakeContext, extract
from tests.tiny import SENTENCES, tiny_project

pytestmark = pytest.mark.unit

JSON = {"Content-Type": "application/json"}
KSERVE = {"explain": "False", "Content-Type": "application/json"}  # a KServe route: no url_path
OPENAI = {"url_path": "v1/embeddings", "Content-Type": "application/json"}
IDS = itertools.count()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """name -> (archive, extracted folder) for the two tiny models these tests serve."""
    root = tmp_path_factory.mktemp("tiny")
    catalogue = Catalogue.load(tiny_project(root))
    out = {}
    for name in ("tiny_text", "tiny_tensor"):
        archive = build_entry(catalogue, name, root, root / "store", progress=lambda _: None, speed_seconds=0.01).archive
        out[name] = (archive, extract(archive, root / name))
    return out


STARTED: list[AsyncHandler] = []


@pytest.fixture(autouse=True)
def close_batchers():
    try:
        yield
    finally:
        while STARTED:
            STARTED.pop().batcher.close()


def worker_handler(model_dir, name: str, sections=None, **runtime):
    """An initialised worker-batching handler and its base context (`sections`: more handler settings)."""
    context = FakeContext(model_dir, name, batch_size=1,
                          handler_overrides={"runtime": {"batching": "worker", **runtime}, **(sections or {})})
    context.model_yaml_config["asyncCommunication"] = True  # what the build writes with worker batching
    handler = AsyncHandler()
    handler.initialize(context)
    STARTED.append(handler)
    return handler, context


def message_context(base: FakeContext, headers: list[dict]) -> FakeContext:
    """One message's own context, as ts/async_service.py deep-copies one per message."""
    context = FakeContext.__new__(FakeContext)
    context.__dict__.update(base.__dict__)  # the metrics recorder stays shared: the tests read it
    context.request_ids = {i: f"r{next(IDS)}" for i in range(len(headers))}
    context.headers = dict(enumerate(headers))
    context.statuses, context.content_types = {}, {}
    return context


async def send(handler, base, bodies: list, headers: list[dict], delay: float = 0.0):
    """One message: [(status, answer JSON)] per request, after `delay` seconds."""
    await asyncio.sleep(delay)
    context = message_context(base, headers)
    raw = await handler.handle([{"body": body} for body in bodies], context)
    return [(context.statuses.get(i, (200, ""))[0], json.loads(raw[i])) for i in range(len(bodies))]


def one(handler, base, body, headers=JSON, delay=0.0):
    return send(handler, base, [body], [headers], delay)


async def gather(*calls):
    return [answer for answers in await asyncio.gather(*calls) for answer in answers]


def batch_sizes(context: FakeContext) -> list[int]:
    """The items of each batch the handler ran, in order (its HandlerBatches counter's dimension)."""
    return [int(call[3]["BatchSize"]) for call in context.metrics.calls if call[1] == "HandlerBatches"]


def text(i: int) -> dict:
    return {"text": SENTENCES[i % len(SENTENCES)]}


def close(one_answer, other) -> bool:
    """The same JSON, numbers within float tolerance (a batch's composition may move the last bits)."""
    return Family.disagreement(None, one_answer, other) is None


# ---- batches form by size and by window ---------------------------------------------------------
def test_a_batch_closes_when_it_holds_the_batch_size(tiny):
    handler, base = worker_handler(tiny["tiny_text"][1], "tiny_text", worker_batch_size=3, batch_window_ms=1000)
    began = time.monotonic()
    answers = asyncio.run(gather(*(one(handler, base, text(i)) for i in range(6))))
    assert time.monotonic() - began < 1.0, "the batches waited for their window instead of closing full"
    assert [status for status, _ in answers] == [200] * 6
    assert batch_sizes(base) == [3, 3]


def test_a_batch_closes_when_the_window_since_its_first_request_has_passed(tiny):
    handler, base = worker_handler(tiny["tiny_text"][1], "tiny_text", worker_batch_size=8, batch_window_ms=300)

    async def scenario():
        began = time.monotonic()
        first = asyncio.gather(one(handler, base, text(0)), one(handler, base, text(1), delay=0.05))
        late = one(handler, base, text(2), delay=0.8)  # after the first batch's window: a batch of its own
        answers = await asyncio.gather(first, late)
        return answers, time.monotonic() - began

    (first, late), seconds = asyncio.run(scenario())
    assert [s for s, _ in (*first[0], *first[1], *late)] == [200] * 3
    assert batch_sizes(base) == [2, 1]
    assert seconds >= 0.8 + 0.3, "the last batch did not wait its window"


def test_a_message_of_several_requests_is_answered_in_its_own_order(tiny):
    """A frontend with batchSize > 1 sends several requests in one message: they share its context."""
    handler, base = worker_handler(tiny["tiny_text"][1], "tiny_text", worker_batch_size=2, batch_window_ms=20)
    answers = asyncio.run(gather(send(handler, base, [text(0), b'{"text": 1', text(2)], [JSON] * 3),
                                 one(handler, base, text(3))))
    assert [status for status, _ in answers] == [200, 400, 200, 200]
    assert batch_sizes(base) == [1, 2]  # the bad one takes a batch place but adds no item


# ---- per-request outcomes, and the same answers as frontend batching ---------------------------
def frontend_answers(model_dir, name: str, bodies: list, headers: list[dict]):
    handler, context = Handler(), FakeContext(model_dir, name, batch_size=len(bodies))
    handler.initialize(context)
    context.headers = dict(enumerate(headers))
    raw = handler.handle([{"body": body} for body in bodies], context)
    return [(context.statuses.get(i, (200, ""))[0], json.loads(raw[i])) for i in range(len(bodies))]


FORMS = [
    (text(0), JSON),
    (b'{"text": "unterminated', JSON),  # a bad request among good ones
    ({"instances": [SENTENCES[1], SENTENCES[2]]}, KSERVE),
    (SENTENCES[3].encode(), {"Content-Type": "text/plain"}),
    ({"model": "tiny_text", "input": [SENTENCES[4], SENTENCES[5]]}, OPENAI),
    ({"text": ""}, JSON),  # refused by the family
    (text(1), JSON),
]


def test_a_bad_request_gets_its_own_4xx_and_its_batch_mates_the_frontend_paths_answers(tiny):
    model_dir = tiny["tiny_text"][1]
    bodies, headers = [b for b, _ in FORMS], [h for _, h in FORMS]
    expected = frontend_answers(model_dir, "tiny_text", bodies, headers)
    handler, base = worker_handler(model_dir, "tiny_text", worker_batch_size=len(FORMS), batch_window_ms=500)
    answers = asyncio.run(gather(*(one(handler, base, b, h) for b, h in FORMS)))
    assert batch_sizes(base) == [7]  # one batch: the two bad requests add no item, the envelopes two each
    assert [s for s, _ in answers] == [s for s, _ in expected] == [200, 400, 200, 200, 200, 400, 200]
    for (_, got), (_, want) in zip(answers, expected):
        assert close(got, want), (got, want)
    assert len(answers[2][1]["predictions"]) == 2 and answers[4][1]["object"] == "list"  # each in its protocol


def test_the_answers_do_not_depend_on_how_the_requests_were_batched(tiny):
    model_dir = tiny["tiny_tensor"][1]
    bodies = [{"inputs": [[[float((i + j) % 16) for j in range(4)] for _ in range(4)]]} for i in range(5)]
    expected = frontend_answers(model_dir, "tiny_tensor", bodies, [JSON] * 5)
    handler, base = worker_handler(model_dir, "tiny_tensor", worker_batch_size=2, batch_window_ms=5)
    answers = asyncio.run(gather(*(one(handler, base, b, delay=0.01 * i) for i, b in enumerate(bodies))))
    assert answers == expected


def test_a_deadline_counts_from_the_requests_own_arrival(tiny):
    """The request waits out the batch window in the worker: a budget shorter than that expires."""
    handler, base = worker_handler(tiny["tiny_text"][1], "tiny_text", worker_batch_size=8, batch_window_ms=100)
    hurried = {**JSON, "X-Request-Timeout-Ms": "20"}
    (late, on_time) = asyncio.run(gather(one(handler, base, text(0), hurried), one(handler, base, text(1))))
    assert late[0] == 504 and "receipt of the request" in late[1]["message"], late
    assert on_time[0] == 200


def test_the_response_cache_answers_across_batches(tiny):
    handler, base = worker_handler(tiny["tiny_text"][1], "tiny_text", {"response_cache": {"max_mib": 1}},
                                   worker_batch_size=4, batch_window_ms=50)
    first = asyncio.run(gather(one(handler, base, text(0))))
    again = asyncio.run(gather(one(handler, base, text(0)), one(handler, base, text(1))))
    assert again[0] == first[0] and again[1][0] == 200
    assert batch_sizes(base) == [1, 1]  # the repeat was answered from the cache, not computed


def test_a_fault_of_the_model_fails_its_batch_alone(tiny, monkeypatch):
    handler, base = worker_handler(tiny["tiny_tensor"][1], "tiny_tensor", worker_batch_size=2, batch_window_ms=50)
    infer, calls = handler.infer, []

    def broken_once(inputs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the model broke")
        return infer(inputs)

    monkeypatch.setattr(handler, "infer", broken_once)
    body = {"inputs": [[[1.0] * 4] * 4]}

    async def scenario():
        failed = await asyncio.gather(one(handler, base, body), one(handler, base, body), return_exceptions=True)
        return failed, await one(handler, base, body)

    failed, after = asyncio.run(scenario())
    assert all(isinstance(f, RuntimeError) for f in failed)  # TorchServe answers these 503 and serves on
    assert after[0][0] == 200


# ---- decoding overlaps inference ------------------------------------------------------------------
def test_the_next_batch_is_decoded_while_the_one_before_it_is_in_the_model(tiny, monkeypatch):
    handler, base = worker_handler(tiny["tiny_tensor"][1], "tiny_tensor", worker_batch_size=1, batch_window_ms=0)
    decode, infer, spans = handler.family.decode, handler.infer, {}

    def timed(kind, work, seconds):
        def run(*args):
            began = time.monotonic()
            time.sleep(seconds)
            out = work(*args)
            spans.setdefault(kind, []).append((began, time.monotonic()))
            return out
        return run

    monkeypatch.setattr(handler.family, "decode", timed("decode", decode, 0.05))
    monkeypatch.setattr(handler, "infer", timed("infer", infer, 0.4))
    body = {"inputs": [[[2.0] * 4] * 4]}
    answers = asyncio.run(gather(one(handler, base, body), one(handler, base, body, delay=0.02)))
    assert [s for s, _ in answers] == [200, 200] and batch_sizes(base) == [1, 1]
    first_in_model, second_decoded = spans["infer"][0], spans["decode"][1]
    assert first_in_model[0] <= second_decoded[0] and second_decoded[1] <= first_in_model[1], (
        f"the second request was decoded at {second_decoded}, not while the first was in the model {first_in_model}")


# ---- settings and what they make the archive ------------------------------------------------------
SECTION = {"family": "tensor", "weights": "m.ts", "runtime": {"graph": "torchscript"},
           "tensor": {"shape": [4]}}


@pytest.mark.parametrize("runtime, words", [
    ({"batching": "workers"}, "runtime.batching: 'workers' is not one of ['frontend', 'worker']"),
    ({"batch_window_ms": -1}, "runtime.batch_window_ms: must be 0 .. 1000"),
    ({"batch_window_ms": 1001}, "runtime.batch_window_ms: must be 0 .. 1000"),
    ({"worker_batch_size": 0}, "runtime.worker_batch_size: must be 1 .. 1024"),
    ({"worker_batch_size": "8"}, "runtime.worker_batch_size: expected an integer"),
])
def test_bad_batching_settings_are_refused_by_name(runtime, words):
    with pytest.raises(ConfigError) as refused:
        HandlerSettings.from_mapping({**SECTION, "runtime": {"graph": "torchscript", **runtime}})
    assert words in str(refused.value)


def test_worker_batching_is_refused_for_a_generating_family():
    section = {"family": "causal_lm", "weights": "m.ts", "runtime": {"graph": "torchscript", "batching": "worker"}}
    with pytest.raises(ConfigError, match="runtime.batching: worker batching is for request/response families"):
        HandlerSettings.from_mapping(section)


def test_the_batching_decides_the_archives_mode_and_handler():
    frontend = HandlerSettings.from_mapping(SECTION)
    worker = HandlerSettings.from_mapping({**SECTION, "runtime": {"graph": "torchscript", "batching": "worker"}})
    assert (dict(frontend.archive_keys()), frontend.handler_entry()) == ({}, "handlers/handler.py")
    assert (dict(worker.archive_keys()), worker.handler_entry()) == ({"asyncCommunication": True}, ASYNC_ENTRY)
    assert worker.runtime.batch_window_ms == 1 and worker.runtime.worker_batch_size == 8


def test_an_archive_copy_follows_the_batching_both_ways(tiny, tmp_path):
    archive = tiny["tiny_text"][0]
    with_handler_settings(archive, tmp_path, "worker", {"runtime": {"batching": "worker"}})
    with_handler_settings(tmp_path / "worker.mar", tmp_path, "back", {"runtime": {"batching": "frontend"}})

    def mode(name):
        with zipfile.ZipFile(tmp_path / f"{name}.mar") as mar:
            config = yaml.safe_load(mar.read("model-config.yaml"))
            handler = json.loads(mar.read(MANIFEST))["model"]["handler"]
            return config.get("asyncCommunication"), handler, handler in mar.namelist()

    assert mode("worker") == (True, "async_handler.py", True)
    assert mode("back") == (None, "handler.py", True)


@pytest.mark.parametrize("batching, asynchronous, words", [
    ("worker", False, "runtime.batching: worker needs asyncCommunication: true"),
    ("frontend", True, "asyncCommunication: true forwards requests one by one"),
])
def test_a_worker_whose_mode_does_not_match_its_batching_does_not_load(tiny, batching, asynchronous, words):
    model_dir = tiny["tiny_tensor"][1]
    context = FakeContext(model_dir, "tiny_tensor", handler_overrides={"runtime": {"batching": batching}})
    context.model_yaml_config["asyncCommunication"] = asynchronous
    with pytest.raises(ConfigError, match=words):
        AsyncHandler().initialize(context)
