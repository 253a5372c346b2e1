"""The causal LM in TorchServe's asynchronous worker mode, through a real TorchServe: the frontend
forwards each request as it arrives and the worker's engine loop steps for all of them.

Answers equal the step-per-call mode's for the same archive (greedy, and sampled with a seed);
streamed equals whole; requests arriving while others generate join their batch; a bad request is
a 400 while the others run on; two workers of one generating model both serve; the generation
metrics reach Prometheus."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmarks.load.generation import generate
from benchmarks.load.server_metrics import Scrape
from serving.launcher import TorchServe
from serving.ts_config import ModelSettings

pytestmark = pytest.mark.e2e

MODEL = "tinylm"
PROMPTS = ["The for statement is used to", "A class definition", "Names refer to objects.", "The import statement"]
BODIES = [{"prompt": p, "max_new_tokens": 24 + 8 * i, "temperature": 0} for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def step_answers(step_lm_server):
    """The step mode's answers (tests/e2e/conftest.py's shared server), the reference."""
    return [generate(step_lm_server.client, MODEL, body, stream=False) for body in BODIES]


@pytest.fixture(scope="module")
def async_server(async_lm_server):
    return async_lm_server


def gauge(server, name: str) -> float:
    return Scrape.of(server.metrics_text()).total(name, MODEL)


def test_async_answers_equal_the_step_modes_whether_alone_or_together(async_server, step_answers):
    alone = [generate(async_server.client, MODEL, body, stream=False) for body in BODIES]
    assert [a.text for a in alone] == [s.text for s in step_answers]
    assert [a.finish_reason for a in alone] == [s.finish_reason for s in step_answers]

    def send(i):
        time.sleep(0.05 * i)  # arrivals spread out: later ones join a batch already generating
        return generate(async_server.client, MODEL, BODIES[i], stream=i % 2 == 0)

    with ThreadPoolExecutor(len(BODIES)) as pool:
        together = list(pool.map(send, range(len(BODIES))))
    assert all(t.ok for t in together), [t.error for t in together]
    assert [t.text for t in together] == [s.text for s in step_answers]


def test_requests_arriving_while_others_generate_join_their_batch(async_server):
    """Long generations arriving 0.2 s apart: the loop's peak gauge (the most sequences one step
    advanced since its last report, about once a second) sees them together."""
    long_bodies = [{"prompt": p, "max_new_tokens": 250, "ignore_eos": True} for p in PROMPTS]
    peak = 0

    def send(i):
        time.sleep(0.2 * i)
        return generate(async_server.client, MODEL, long_bodies[i], stream=True)

    with ThreadPoolExecutor(len(long_bodies)) as pool:
        futures = [pool.submit(send, i) for i in range(len(long_bodies))]
        while not all(f.done() for f in futures):
            peak = max(peak, gauge(async_server, "GenerationPeakRunningSequences"))
            time.sleep(0.1)
    settled = time.monotonic() + 2.5  # the loop's last report of the burst comes within a second
    while peak < 2 and time.monotonic() < settled:
        peak = max(peak, gauge(async_server, "GenerationPeakRunningSequences"))
        time.sleep(0.1)
    assert all(f.result().ok and f.result().generated_tokens == 250 for f in futures)
    assert peak >= 2, "the requests never shared a batch"


def test_streamed_equals_whole_sampled_with_a_seed(async_server):
    body = {"prompt": PROMPTS[0], "max_new_tokens": 30, "temperature": 0.8, "top_k": 50, "seed": 5}
    whole = generate(async_server.client, MODEL, body, stream=False)
    streamed = generate(async_server.client, MODEL, body, stream=True)
    assert whole.ok and streamed.ok, (whole.error, streamed.error)
    assert streamed.text == whole.text and len(streamed.chunk_times) > 1


def test_a_bad_request_is_a_400_while_the_others_run_on(async_server):
    with ThreadPoolExecutor(2) as pool:
        good = pool.submit(generate, async_server.client, MODEL, {"prompt": PROMPTS[1], "max_new_tokens": 20}, False)
        time.sleep(0.1)
        bad = async_server.client.predict(MODEL, {"prompt": PROMPTS[1], "temperature": -1})
        assert bad.status_code == 400 and "temperature" in bad.json()["message"], bad.text
        assert good.result().ok and good.result().generated_tokens == 20


def test_the_generation_metrics_reach_prometheus(async_server):
    generate(async_server.client, MODEL, {"prompt": PROMPTS[2], "max_new_tokens": 8})
    deadline = time.monotonic() + 20
    names = ("GenerationTokens", "GenerationFirstTokens", "GenerationTimeToFirstTokenMs", "GenerationInterTokens",
             "GenerationTokensPerSecond")
    while time.monotonic() < deadline and not all(gauge(async_server, n) > 0 for n in names):
        time.sleep(0.3)
    assert all(gauge(async_server, n) > 0 for n in names), {n: gauge(async_server, n) for n in names}


def test_two_workers_of_one_generating_model_both_serve(model_store):
    settings = {MODEL: ModelSettings(batch_size=1, max_batch_delay_ms=1, min_workers=2, max_workers=2, threads=1)}
    with TorchServe(model_store, models=settings, load=(MODEL,)) as ts:
        pids = ts.worker_pids(MODEL)
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda b: generate(ts.client, MODEL, b, stream=False), BODIES))
        assert len(pids) == 2 and all(r.ok for r in results), [r.error for r in results]
