"""The causal-LM family through a real TorchServe in the step mode (continuous batching: one
frontend call per decoding step; the async mode has tests/e2e/test_async_generation.py): streamed == whole,
a request inside a running batch == the same request alone, a bad request is a 400 while the
others run on, a client that hangs up mid-stream releases its sequence, and the generation
metrics reach Prometheus."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmarks.load.generation import generate
from benchmarks.load.server_metrics import Scrape

pytestmark = pytest.mark.e2e

MODEL = "tinylm"
PROMPTS = ["The for statement is used to", "A class definition", "Names refer to objects.",
           "The import statement"]


@pytest.fixture(scope="module")
def lm_server(step_lm_server):
    """The step mode at batchSize 4 (tests/e2e/conftest.py's shared server)."""
    return step_lm_server


def gauge(server, name: str) -> float:
    return Scrape.of(server.metrics_text()).total(name, MODEL)


def wait_for_gauge(server, name: str, value: float, seconds: float = 20.0) -> float:
    """Workers report metrics through their log: the frontend shows them a moment later."""
    deadline = time.monotonic() + seconds
    while True:
        seen = gauge(server, name)
        if seen == value or time.monotonic() > deadline:
            return seen
        time.sleep(0.2)


@pytest.mark.parametrize("extra", [{}, {"temperature": 0.8, "top_k": 50, "seed": 5}, {"stop": ["."]}])
def test_streamed_equals_whole(lm_server, extra):
    body = {"prompt": PROMPTS[0], "max_new_tokens": 40, **extra}
    whole = generate(lm_server.client, MODEL, body, stream=False)
    streamed = generate(lm_server.client, MODEL, body, stream=True)
    assert whole.ok and streamed.ok, (whole.error, streamed.error)
    assert streamed.text == whole.text and streamed.finish_reason == whole.finish_reason
    assert len(streamed.chunk_times) > 1  # it did come in pieces
    assert whole.text.strip()


def test_requests_inside_one_running_batch_equal_each_alone(lm_server):
    bodies = [{"prompt": p, "max_new_tokens": 30 + 10 * i} for i, p in enumerate(PROMPTS)]
    alone = [generate(lm_server.client, MODEL, b, stream=False) for b in bodies]
    peak = 0

    def send(i):
        time.sleep(0.05 * i)  # arrivals spread out: later ones join a batch already generating
        return generate(lm_server.client, MODEL, bodies[i])

    with ThreadPoolExecutor(len(bodies)) as pool:
        futures = [pool.submit(send, i) for i in range(len(bodies))]
        while not all(f.done() for f in futures):
            peak = max(peak, gauge(lm_server, "GenerationRunningSequences"))
            time.sleep(0.05)
    together = [f.result() for f in futures]
    assert [t.text for t in together] == [a.text for a in alone]
    assert peak >= 2, "the requests never shared a batch"


def test_bad_parameters_get_400_while_a_generation_runs_on(lm_server):
    pid = lm_server.worker_pids(MODEL)
    long_body = {"prompt": PROMPTS[1], "max_new_tokens": 120}
    reference = generate(lm_server.client, MODEL, long_body, stream=False)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(generate, lm_server.client, MODEL, long_body)
        time.sleep(0.3)
        for bad, field in [({"prompt": "x", "max_new_tokens": 100000}, "max_new_tokens"),
                           ({"prompt": "x", "top_p": 2}, "top_p"), ({"text": "x"}, "text")]:
            resp = lm_server.predict(MODEL, bad)
            assert resp.status_code == 400 and field in resp.json()["message"], resp.text
        assert running.result().text == reference.text
    assert lm_server.worker_pids(MODEL) == pid


def test_a_client_that_hangs_up_releases_its_sequence(lm_server):
    before = Scrape.of(lm_server.metrics_text()).total("GenerationReleasedOnDisconnect", MODEL)
    left = generate(lm_server.client, MODEL, {"prompt": PROMPTS[2], "max_new_tokens": 256}, stop_after_chunks=3)
    assert len(left.chunk_times) == 3
    # The frontend learns of the hang-up on its next write and stops sending that request; the
    # worker drops it at its next step (another request's, here).
    assert generate(lm_server.client, MODEL, {"prompt": PROMPTS[3], "max_new_tokens": 8}).ok
    assert wait_for_gauge(lm_server, "GenerationRunningSequences", 0) == 0
    after = Scrape.of(lm_server.metrics_text()).total("GenerationReleasedOnDisconnect", MODEL)
    assert after >= before + 1


def test_generation_metrics_on_prometheus(lm_server):
    scrape = Scrape.of(lm_server.metrics_text())
    for name in ("GenerationTokens", "GenerationFirstTokens", "GenerationTimeToFirstTokenMs",
                 "GenerationInterTokenMs"):
        assert scrape.total(name, MODEL) > 0, name


def test_a_shared_prefix_is_served_from_the_cache_with_the_same_answer(lm_server):
    from pydoc_data.topics import topics

    header = topics["for"][:1500]  # ~400 tokens, a few cache blocks
    asked = {"prompt": header + "\n\nQuestion: what is it?", "max_new_tokens": 12}
    before = Scrape.of(lm_server.metrics_text())
    first = generate(lm_server.client, MODEL, asked, stream=False)  # a miss: the prefix is kept
    other = generate(lm_server.client, MODEL, {**asked, "prompt": header + "\n\nAnd then?"}, stream=False)
    again = generate(lm_server.client, MODEL, asked, stream=False)
    assert first.ok and other.ok and again.ok
    assert again.text == first.text
    deadline = time.monotonic() + 20
    while gauge(lm_server, "GenerationPrefixCacheHits") < before.total("GenerationPrefixCacheHits", MODEL) + 2 \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    after = Scrape.of(lm_server.metrics_text())
    assert after.total("GenerationPrefixCacheHits", MODEL) >= before.total("GenerationPrefixCacheHits", MODEL) + 2
    assert after.total("GenerationPrefixCacheReusedTokens", MODEL) > before.total("GenerationPrefixCacheReusedTokens",
                                                                                  MODEL) + 300
    assert after.total("GenerationPrefixCacheMisses", MODEL) >= 1 and after.total("GenerationPrefixCacheBytes", MODEL) > 0


def test_the_priority_header_is_read_and_a_bad_one_is_a_400(lm_server):
    body = {"prompt": PROMPTS[0], "max_new_tokens": 6}
    high = generate(lm_server.client, MODEL, body, stream=False, headers={"X-Priority": "high"})
    plain = generate(lm_server.client, MODEL, body, stream=False)
    assert high.ok and high.text == plain.text
    bad = generate(lm_server.client, MODEL, body, stream=False, headers={"X-Priority": "urgent"})
    assert bad.status == 400 and "X-Priority" in bad.error
