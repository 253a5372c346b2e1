"""The causal LM in TorchServe's asynchronous worker mode, in-process: each request a coroutine, the
engine loop stepping for all of them (handlers/generation/async_serving.py, engine_loop.py).

Answers equal the step-per-call mode's; requests that arrive while others generate join their batch;
a bad request gets its 400 alone; a fault of the model fails only the requests the loop held."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from build.archive import build_entry
from build.catalogue import Catalogue
from handlers.async_handler import AsyncHandler
from handlers.generation.async_serving import AsyncGenerationService
from handlers.handler import Handler
from serving.fake_context import FakeContext, extract
from tests.tiny import tiny_project

pytestmark = pytest.mark.unit

PROMPTS = ["The for statement", "A class definition defines", "Exceptions are raised when", "A man is"]


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    catalogue = Catalogue.load(tiny_project(root))
    archive = build_entry(catalogue, "tiny_lm", root, root / "store", progress=lambda _: None).archive
    return extract(archive, root / "tiny_lm")


STARTED: list[Handler] = []


@pytest.fixture(autouse=True)
def stop_engine_loops():
    """Every engine loop a test starts is stopped after it: an idle loop keeps reporting otherwise."""
    try:
        yield
    finally:
        while STARTED:
            loop = getattr(STARTED.pop().generation, "loop", None)
            if loop is not None:
                loop.stop()


def handler_in(model_dir: Path, mode: str):
    context = FakeContext(model_dir, "tiny_lm", batch_size=8, handler_overrides={"causal_lm": {"mode": mode}})
    if mode == "async":  # what the build writes into an async archive's model-config.yaml
        context.model_yaml_config.pop("continuousBatching", None)
        context.model_yaml_config["asyncCommunication"] = True
    handler = AsyncHandler() if mode == "async" else Handler()  # what the archive's manifest names
    handler.initialize(context)
    STARTED.append(handler)
    return handler, context


class Sent:
    """What the service handed the engine adapter to stream (its send_step), per request id."""

    def __init__(self):
        self.lines = {}
        self.content_types = set()

    def __call__(self, parts):
        for _, request, chunk in parts:
            self.lines.setdefault(request.request_id, []).append(chunk.body)
            self.content_types.add(chunk.content_type)


def stream_into(handler, sent: Sent) -> None:
    """The service's streamed chunks caught instead of sent to TorchServe."""
    handler.generation.door = replace(handler.generation.door, send_step=sent)


def call_context(base: FakeContext, request_id: str, body: dict, headers=None) -> FakeContext:
    """One request's context, as ts/async_service.py deep-copies one per call."""
    context = FakeContext.__new__(FakeContext)
    context.__dict__.update(base.__dict__)
    context.request_ids = {0: request_id}
    context.headers = {0: {"Content-Type": "application/json", **(headers or {})}}
    context.statuses, context.content_types, context.response_headers = {}, {}, {}
    return context


async def ask(handler, base, request_id, body, delay=0.0, headers=None):
    await asyncio.sleep(delay)
    context = call_context(base, request_id, body, headers)
    (answer,) = await handler.handle([{"body": json.dumps(body).encode()}], context)
    return answer, context


def step_answers(model_dir, bodies):
    """The step-per-call mode's answers to the same bodies, each alone (greedy: the same text)."""
    handler, context = handler_in(model_dir, "step")
    out = []
    for body in bodies:
        seq = handler.generation.engine.generate([("k", handler.family.decode(body, ""))])["k"]
        out.append((seq.text.take(final=True), seq.finish, seq.generated))
    return out


def test_requests_joining_a_running_batch_get_the_step_modes_answers(tiny_lm):
    handler, base = handler_in(tiny_lm, "async")
    assert isinstance(handler.generation, AsyncGenerationService)
    stream_into(handler, sent := Sent())
    bodies = [{"prompt": p, "max_new_tokens": 12, "temperature": 0, "stream": i % 2 == 0}
              for i, p in enumerate(PROMPTS)]

    async def run():
        return await asyncio.gather(*(ask(handler, base, f"r{i}", b, delay=0.01 * i) for i, b in enumerate(bodies)))

    results = asyncio.run(run())
    for (answer, context), body, (text, finish, generated), i in zip(results, bodies, step_answers(tiny_lm, bodies),
                                                                     range(len(bodies))):
        assert not context.statuses
        if body["stream"]:
            lines = [json.loads(line) for chunk in [*sent.lines.get(f"r{i}", []), answer]
                     for line in chunk.decode().splitlines()]
            assert "".join(line["text"] for line in lines) == text
            assert (lines[-1]["finish_reason"], lines[-1]["generated_tokens"]) == (finish, generated)
        else:
            whole = json.loads(answer)
            assert (whole["text"], whole["finish_reason"], whole["generated_tokens"]) == (text, finish, generated)
    assert AsyncHandler.handle is not Handler.handle
    assert sent.content_types == {"application/x-ndjson"}


def test_each_async_request_is_read_from_the_context_once(tiny_lm):
    """The async door reads the engine adapter's records: one read of each request's headers, and
    its answer's status and content type written back by the adapter from its Reply."""
    from .counting_context import CountingContext

    handler, base = handler_in(tiny_lm, "async")

    async def one(request_id, body, headers):
        context = CountingContext.__new__(CountingContext)
        context.__dict__.update(call_context(base, request_id, body, headers).__dict__)
        context.header_reads = Counter()
        (answer,) = await handler.handle([{"body": json.dumps(body).encode()}], context)
        return answer, context

    async def run():
        return await asyncio.gather(
            one("a", {"prompt": PROMPTS[0], "max_new_tokens": 3}, {"X-Priority": "high"}),
            one("b", {"prompt": PROMPTS[0], "temperature": -2}, {}),
            one("c", {"model": "tiny_lm", "prompt": PROMPTS[1], "max_tokens": 2}, {"url_path": "v1/completions"}))

    (good, good_ctx), (bad, bad_ctx), (chat, chat_ctx) = asyncio.run(run())
    assert [dict(c.header_reads) for c in (good_ctx, bad_ctx, chat_ctx)] == [{0: 1}] * 3, "header reads per request"
    assert json.loads(good)["generated_tokens"] == 3 and good_ctx.content_types[0] == "application/json"
    assert bad_ctx.statuses[0][0] == 400 and "temperature" in json.loads(bad)["message"]
    assert json.loads(chat)["usage"]["completion_tokens"] == 2 and not chat_ctx.statuses


def test_the_async_service_runs_behind_any_engine_adapter(tiny_lm):
    """Records in, Replies and streamed chunks out: no TorchServe context anywhere (the seam another
    engine's adapter plugs into)."""
    from handlers.deadlines import Arrival
    from handlers.generation.door import RecordDoor
    from handlers.request import open_request

    handler, _ = handler_in(tiny_lm, "async")
    sent = Sent()
    service = handler.generation
    service.door = RecordDoor(decode=handler.decode_request, refuse=handler.refusal, send_step=sent)
    bodies = [{"prompt": PROMPTS[0], "max_new_tokens": 6, "temperature": 0, "stream": True},
              {"prompt": PROMPTS[1], "temperature": -2},
              {"model": "tiny_lm", "prompt": PROMPTS[2], "max_tokens": 3, "temperature": 0}]
    headers = [{}, {}, {"url_path": "v1/completions"}]
    arrival = Arrival.now()
    records = [open_request(i, f"x{i}", {"Content-Type": "application/json", **h}, b, arrival, None)
               for i, (b, h) in enumerate(zip(bodies, headers))]
    stream, bad, openai = asyncio.run(asyncio.wait_for(service.serve(records, "not a TorchServe context"), 10))
    lines = [json.loads(line) for chunk in [*sent.lines.get("x0", []), stream.body]
             for line in chunk.decode().splitlines()]
    assert stream.status == 200 and stream.content_type == "application/x-ndjson"
    assert lines[-1]["generated_tokens"] == 6 and len(sent.lines["x0"]) >= 1
    assert bad.status == 400 and "temperature" in bad.message
    assert openai.status == 200 and json.loads(openai.body)["usage"]["completion_tokens"] == 3


def test_a_bad_request_gets_its_400_and_the_others_go_on(tiny_lm):
    handler, base = handler_in(tiny_lm, "async")

    async def run():
        return await asyncio.gather(ask(handler, base, "good", {"prompt": PROMPTS[0], "max_new_tokens": 5}),
                                    ask(handler, base, "bad", {"prompt": PROMPTS[0], "temperature": -2}))

    (good, good_ctx), (bad, bad_ctx) = asyncio.run(run())
    assert bad_ctx.statuses[0][0] == 400 and "temperature" in json.loads(bad)["message"]
    assert not good_ctx.statuses and json.loads(good)["generated_tokens"] == 5


def test_a_fault_of_the_model_fails_the_requests_it_held_with_a_500_and_the_loop_goes_on(tiny_lm, monkeypatch):
    handler, base = handler_in(tiny_lm, "async")
    engine = handler.generation.engine
    real_step = engine.step
    calls = {"n": 0}

    def failing_step():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("a fault of ours")
        return real_step()

    monkeypatch.setattr(engine, "step", failing_step)

    async def run():
        held = await asyncio.gather(*(ask(handler, base, f"h{i}", {"prompt": p, "max_new_tokens": 12})
                                      for i, p in enumerate(PROMPTS[:2])))
        after = await ask(handler, base, "after", {"prompt": PROMPTS[2], "max_new_tokens": 4})
        return held, after

    held, (after, after_ctx) = asyncio.run(run())
    assert [ctx.statuses[0][0] for _, ctx in held] == [500, 500]
    assert all(json.loads(answer)["code"] == 500 for answer, _ in held)
    assert not after_ctx.statuses and json.loads(after)["generated_tokens"] == 4


def test_the_loop_reports_tokens_per_second_and_running_sequences(tiny_lm):
    handler, base = handler_in(tiny_lm, "async")
    handler.generation.loop.stats_every_s = 0.0

    async def run():
        return await ask(handler, base, "m", {"prompt": PROMPTS[0], "max_new_tokens": 8})

    asyncio.run(run())
    deadline = time.monotonic() + 5
    while base.metrics.last("GenerationTokens") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    names = {call[1] for call in base.metrics.calls}
    assert {"GenerationTokens", "GenerationTimeToFirstTokenMs", "GenerationRunningSequences",
            "GenerationWaitingSequences", "GenerationTokensPerSecond"} <= names, names


def test_the_build_writes_the_async_mode_into_the_archive_by_default(tmp_path):
    root = tmp_path
    path = tiny_project(root)
    raw = yaml.safe_load(path.read_text())
    del raw["models"]["tiny_lm"]["settings"]["causal_lm"]["mode"]  # an entry that does not say
    raw["models"] = {"tiny_lm": raw["models"]["tiny_lm"]}
    path.write_text(yaml.safe_dump(raw))
    archive = build_entry(Catalogue.load(path), "tiny_lm", root, root / "store", progress=lambda _: None).archive
    folder = extract(archive, root / "x")
    config = yaml.safe_load((folder / "model-config.yaml").read_text())
    manifest = json.loads((folder / "MAR-INF" / "MANIFEST.json").read_text())
    assert config.get("asyncCommunication") is True and "continuousBatching" not in config
    assert manifest["model"]["handler"] == "async_handler.py"


def test_a_copy_of_an_archive_switched_to_async_carries_what_the_build_would_write(tmp_path):
    from benchmarks.bench.archive_settings import with_handler_settings

    path = tiny_project(tmp_path)
    step = build_entry(Catalogue.load(path), "tiny_lm", tmp_path, tmp_path / "store", progress=lambda _: None).archive
    with_handler_settings(step, tmp_path / "async", "tiny_lm", {"causal_lm": {"mode": "async"}})
    folder = extract(tmp_path / "async" / "tiny_lm.mar", tmp_path / "x")
    config = yaml.safe_load((folder / "model-config.yaml").read_text())
    manifest = json.loads((folder / "MAR-INF" / "MANIFEST.json").read_text())
    assert config.get("asyncCommunication") is True and "continuousBatching" not in config
    assert manifest["model"]["handler"] == "async_handler.py" and (folder / "async_handler.py").is_file()
    with_handler_settings(tmp_path / "async" / "tiny_lm.mar", tmp_path / "back", "tiny_lm",
                          {"causal_lm": {"mode": "step"}})
    back = extract(tmp_path / "back" / "tiny_lm.mar", tmp_path / "y")
    config = yaml.safe_load((back / "model-config.yaml").read_text())
    assert config.get("continuousBatching") is True and "asyncCommunication" not in config
    assert json.loads((back / "MAR-INF" / "MANIFEST.json").read_text())["model"]["handler"] == "handler.py"


def test_the_generation_tuner_searches_worker_layouts_and_streams_for_an_async_archive(tiny_lm, tmp_path):
    from benchmarks.bench.archive_settings import with_handler_settings
    from benchmarks.tune import generation

    archive = tiny_lm.parent / "store" / "tiny_lm.mar"
    for mode in ("async", "step"):
        with_handler_settings(archive, tmp_path / mode, "tiny_lm", {"causal_lm": {"mode": mode}})
    assert generation.is_async(tmp_path / "async" / "tiny_lm.mar")
    assert not generation.is_async(tmp_path / "step" / "tiny_lm.mar")
    space = generation.search_space(True, cores=2)
    assert {(s.batch_size, s.min_workers, s.threads) for s, _ in space} == {(1, 1, 2), (1, 1, 1), (1, 2, 1)}
    assert sorted({n for _, n in space}) == list(generation.BATCH_SIZES)
    step = generation.search_space(False, cores=2)
    assert [(s.batch_size, s.min_workers, n) for s, n in step] == [(b, 1, 0) for b in generation.BATCH_SIZES]


@pytest.mark.parametrize("stream", [False, True])
def test_every_admitted_request_is_answered_at_any_length(tiny_lm, stream):
    """A sequence admitted and finished within one iteration of the loop (its prefill's token, then
    one step) is answered like any other: at 1, 2 and 3 new tokens, alone and beside a long one."""
    handler, base = handler_in(tiny_lm, "async")
    stream_into(handler, Sent())

    async def run():
        bodies = [{"prompt": PROMPTS[0], "max_new_tokens": 16, "temperature": 0}] + [
            {"prompt": PROMPTS[1], "max_new_tokens": n, "temperature": 0, "stream": stream} for n in (1, 2, 3)]
        asks = [ask(handler, base, f"n{i}", body, delay=0.003 * i) for i, body in enumerate(bodies)]
        return await asyncio.wait_for(asyncio.gather(*asks), timeout=10)

    results = asyncio.run(run())
    for (answer, context), n in zip(results[1:], (1, 2, 3)):
        assert not context.statuses
        last = json.loads(answer.decode().splitlines()[-1])
        assert last["generated_tokens"] == n and last["finish_reason"] == "length"

    async def alone(n):
        return await asyncio.wait_for(ask(handler, base, f"alone{n}", {"prompt": PROMPTS[2], "max_new_tokens": n}), 10)

    for n in (1, 2, 3):
        answer, _ = asyncio.run(alone(n))
        assert json.loads(answer)["generated_tokens"] == n


def test_a_request_the_engine_cannot_take_gets_its_500_and_the_loop_goes_on(tiny_lm, monkeypatch):
    handler, base = handler_in(tiny_lm, "async")
    engine = handler.generation.engine
    real_new = engine.new_sequence

    def new_sequence(key, request):
        if key == "odd":
            raise RuntimeError("a fault of ours with this request")
        return real_new(key, request)

    monkeypatch.setattr(engine, "new_sequence", new_sequence)

    async def run():
        return await asyncio.wait_for(asyncio.gather(
            ask(handler, base, "odd", {"prompt": PROMPTS[0], "max_new_tokens": 4}),
            ask(handler, base, "fine", {"prompt": PROMPTS[1], "max_new_tokens": 4})), timeout=10)

    (odd, odd_ctx), (fine, fine_ctx) = asyncio.run(run())
    assert odd_ctx.statuses[0][0] == 500 and json.loads(odd)["code"] == 500
    assert not fine_ctx.statuses and json.loads(fine)["generated_tokens"] == 4


@pytest.mark.parametrize("field", ["\u00e9", "a\r\nb", "\u4e2d\x00"])
def test_a_refusal_of_any_characters_gets_a_printable_reason_phrase(tiny_lm, field):
    """The frontend reads a reason phrase's length in characters and its bytes in UTF-8: a phrase
    that is not one printable ASCII line would desynchronise it and silence the model."""
    handler, base = handler_in(tiny_lm, "async")
    body = {"model": "tiny_lm", "prompt": "A man is", "max_tokens": 2, field: 1}

    async def run():
        return await asyncio.wait_for(ask(handler, base, "odd", body, headers={"url_path": "v1/completions"}), 10)

    answer, context = asyncio.run(run())
    status, phrase = context.statuses[0]
    assert status == 400 and all(32 <= ord(c) < 127 for c in phrase) and phrase
    assert field in json.loads(answer)["error"]["message"]  # the body keeps the field's name as sent
