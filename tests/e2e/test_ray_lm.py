"""The causal LM on Ray Serve (serving/ray/generation.py): the async engine loop in a replica answers
greedy prompts as the handler does in-process, on /predictions and through the `openai` client at a
plain /v1 (stream and not), short generations end, a bad field is that request's own 400, and the LM is ready on every readiness
route (/ping, OIP v2, KServe v1, which is also OpenAI's model retrieval); the archive built for
TorchServe's step mode generates on Ray too, in the engine loop; guidellm's stock requests at the plain /v1."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests

from benchmarks.bench.archive_settings import with_handler_settings
from handlers.handler import Handler
from serving.fake_context import FakeContext, extract
from serving.ray.launcher import RayServe
from serving.ts_config import ModelSettings
from tests.e2e.conftest import LM
from tests.e2e.ray_cluster import running
from tests.e2e.test_guidellm import OUTPUT_TOKENS, REQUESTS, guidellm

pytestmark = pytest.mark.e2e

PROMPT = "The for statement is used to"
GREEDY = {"prompt": PROMPT, "max_new_tokens": 8, "temperature": 0}
TIMEOUT_S = 30.0  # a generation that does not end is a failure, not a hang
STEP = f"{LM}_step"  # the LM's archive built for TorchServe's step mode (continuousBatching)


@pytest.fixture(scope="module")
def ray_lm(model_store, tmp_path_factory):
    """The LM as built (async mode), and beside it the same archive built for TorchServe's step mode."""
    store = tmp_path_factory.mktemp("ray-lm-store")
    (store / f"{LM}.mar").symlink_to((model_store / f"{LM}.mar").resolve())
    with_handler_settings(model_store / f"{LM}.mar", store, STEP, {"causal_lm": {"mode": "step"}})
    one = ModelSettings(batch_size=1, max_batch_delay_ms=1)
    yield from running(RayServe(store, models=(LM, STEP), settings={LM: one, STEP: one}))


@pytest.fixture(scope="module")
def client(ray_lm) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{ray_lm.inference_url}/v1", api_key=ray_lm.tokens.inference,
                         timeout=TIMEOUT_S, max_retries=0)


@pytest.fixture(scope="module")
def in_process(model_store, tmp_path_factory) -> dict:
    """The greedy answer of the archive's handler in-process (one batch per call, no engine loop)."""
    context = FakeContext(extract(model_store / f"{LM}.mar", tmp_path_factory.mktemp(LM)), LM, batch_size=1)
    context.model_yaml_config.pop("asyncCommunication", None)
    handler = Handler()
    handler.initialize(context)
    context.headers[0] = {"explain": "False", "url_path": "", "content-type": "application/json"}
    context.request_ids = {0: "reference"}
    (answer,) = handler.handle([{"body": GREEDY}], context)
    return json.loads(answer)


def post(ray_lm, body: dict, **kwargs):
    return ray_lm.predict(LM, json.dumps(body).encode(), "application/json", timeout_s=TIMEOUT_S, **kwargs)


def ndjson(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_greedy_prompt_answers_as_in_process_whole_and_streamed(ray_lm, in_process):
    whole = post(ray_lm, GREEDY)
    assert whole.status_code == 200, whole.text
    assert whole.json() == in_process
    streamed = post(ray_lm, {**GREEDY, "stream": True}, stream=True)
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("application/x-ndjson")
    lines = ndjson(streamed.text)
    assert len(lines) > 1, lines  # chunks, not one answer
    assert "".join(line["text"] for line in lines) == in_process["text"]
    assert lines[-1]["generated_tokens"] == in_process["generated_tokens"]


def test_an_archive_built_for_step_mode_runs_the_engine_loop(ray_lm, in_process):
    """Step mode is TorchServe's frontend protocol (it sends the running requests back each step); on
    Ray the same archive generates in the engine loop, with the same greedy answer."""
    whole = ray_lm.predict(STEP, json.dumps(GREEDY).encode(), "application/json", timeout_s=TIMEOUT_S)
    assert whole.status_code == 200, whole.text
    assert whole.json() == in_process
    streamed = ray_lm.predict(STEP, json.dumps({**GREEDY, "stream": True}).encode(), "application/json",
                              timeout_s=TIMEOUT_S, stream=True)
    assert "".join(line["text"] for line in ndjson(streamed.text)) == in_process["text"]


def test_the_lm_is_ready_on_every_readiness_route(ray_lm):
    auth = {"Authorization": f"Bearer {ray_lm.tokens.inference}"}
    ping = requests.get(f"{ray_lm.inference_url}/ping", timeout=TIMEOUT_S)
    assert (ping.status_code, ping.json()) == (200, {"status": "Healthy"}), ping.text
    for path in ("/v2/health/ready", f"/v2/models/{LM}/ready"):
        assert requests.get(f"{ray_lm.inference_url}{path}", headers=auth, timeout=TIMEOUT_S).status_code == 200, path
    meta = requests.get(f"{ray_lm.inference_url}/v2/models/{LM}", headers=auth, timeout=TIMEOUT_S)
    assert meta.status_code == 200 and meta.json()["name"] == LM, meta.text


def test_the_openai_client_at_a_plain_v1_stream_and_not(client, in_process):
    assert LM in [m.id for m in client.models.list().data]
    card = client.models.retrieve(LM)  # the same path is KServe v1's readiness: both protocols' fields
    assert (card.id, card.object, card.model_extra["ready"]) == (LM, "model", True)
    whole = client.completions.create(model=LM, prompt=PROMPT, max_tokens=8, temperature=0)
    assert whole.choices[0].text == in_process["text"]
    assert whole.usage.completion_tokens == in_process["generated_tokens"]
    chunks = list(client.completions.create(model=LM, prompt=PROMPT, max_tokens=8, temperature=0, stream=True))
    assert len(chunks) > 2 and "".join(c.choices[0].text for c in chunks) == in_process["text"]
    chat = client.chat.completions.create(model=LM, messages=[{"role": "user", "content": PROMPT}], max_tokens=4,
                                          temperature=0)
    streamed = client.chat.completions.create(model=LM, messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=4, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == chat.choices[0].message.content


@pytest.mark.parametrize("tokens", [1, 2])
def test_one_or_two_new_tokens_are_answered(ray_lm, client, tokens):
    whole = post(ray_lm, {**GREEDY, "max_new_tokens": tokens})
    assert whole.status_code == 200 and whole.json()["generated_tokens"] == tokens, whole.text
    streamed = post(ray_lm, {**GREEDY, "max_new_tokens": tokens, "stream": True}, stream=True)
    assert streamed.status_code == 200 and ndjson(streamed.text)[-1]["generated_tokens"] == tokens, streamed.text
    chunks = list(client.completions.create(model=LM, prompt=PROMPT, max_tokens=tokens, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == tokens


def test_a_bad_field_is_its_own_400_while_others_generate(ray_lm, client, in_process):
    with ThreadPoolExecutor(3) as pool:
        goods = [pool.submit(post, ray_lm, GREEDY) for _ in range(2)]
        bad = post(ray_lm, {**GREEDY, "bogus": 1})
        assert [g.result().json() for g in goods] == [in_process] * 2
    assert bad.status_code == 400 and "bogus" in bad.json()["message"], bad.text
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=LM, prompt=PROMPT, max_tokens=2, extra_body={"bogus": 1})
    body = refused.value.body
    assert body.get("error", body)["param"] == "bogus", body


def test_guidellms_stock_requests_at_the_plain_v1(ray_lm, tmp_path):
    """guidellm, unchanged, at Ray's plain /v1 (the ingress sends each request to the LM its `model`
    names): its streamed requests with vLLM's usage options all succeed with the length asked."""
    run = guidellm(ray_lm, "/v1/completions", tmp_path / "guidellm.json", base="")
    totals = run["metrics"]["request_totals"]
    errors = [r.get("info", {}).get("error") for r in run["requests"]["errored"]]
    assert (totals["successful"], totals["errored"], totals["incomplete"]) == (REQUESTS, 0, 0), errors[:2]
    assert [r["output_tokens"] for r in run["requests"]["successful"]] == [OUTPUT_TOKENS] * REQUESTS
