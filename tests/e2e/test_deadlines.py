"""Deadlines through a real TorchServe: a request whose budget ran out while the frontend held it for
its batch (maxBatchDelay) gets a 504 and its batch-mates a 200; a malformed deadline header gets a
400 naming it; the handler's counter reaches /metrics.

TorchServe 0.12 does not tell the worker when its frontend received a request, so the client stamps
its send time (X-Request-Start-Ms) for the time in the frontend to count (handlers/deadlines.py)."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmarks.load.inputs import requests as example_requests
from benchmarks.load.server_metrics import Scrape
from build.archive import build_entry
from build.catalogue import Catalogue
from handlers.deadlines import START_HEADER, TIMEOUT_HEADER
from handlers.stage_metrics import DEADLINE_EXPIRED_METRIC
from serving.launcher import TorchServe
from serving.repo import CATALOGUE, MODEL_STORE, REPO_ROOT
from serving.ts_config import ModelSettings

pytestmark = pytest.mark.e2e

NAMES = Catalogue.load(CATALOGUE).names_of(generating=False)
MODEL = "digits" if "digits" in NAMES else NAMES[0]  # the quickest to build; deadlines are the same for all
DELAY_MS = 300  # every batch that does not fill waits this long in the frontend


@pytest.fixture(scope="module")
def slow_batches():
    build_entry(Catalogue.load(CATALOGUE), MODEL, REPO_ROOT, MODEL_STORE, progress=print)
    settings = {MODEL: ModelSettings(batch_size=8, max_batch_delay_ms=DELAY_MS, min_workers=1, max_workers=1)}
    with TorchServe(MODEL_STORE, models=settings, load=(MODEL,)) as server:
        yield server


def post_all(server, extra_headers):
    example = example_requests(MODEL)[0]

    def post(headers):
        return server.predict(MODEL, example.body, example.content_type, headers=headers)

    with ThreadPoolExecutor(max_workers=len(extra_headers)) as pool:
        return list(pool.map(post, extra_headers))


def test_a_request_out_of_time_gets_504_and_the_others_200(slow_batches):
    before = Scrape.of(slow_batches.metrics_text()).total(DEADLINE_EXPIRED_METRIC, MODEL)
    sent_ms = str(int(time.time() * 1000))
    headers = [{}, {"x-request-timeout-ms": "1", "X-Request-Start-Ms": sent_ms}, {},
               {TIMEOUT_HEADER: "60000", START_HEADER: sent_ms}]

    responses = post_all(slow_batches, headers)

    assert [r.status_code for r in responses] == [200, 504, 200, 200], [r.text[:200] for r in responses]
    body = responses[1].json()
    assert body["code"] == 504 and body["type"] == "DeadlineExceeded" and "not computed" in body["message"]
    # Workers report metrics through their log stream, a moment after the answers (bounded wait).
    waited = time.monotonic() + 10
    while True:
        after = Scrape.of(slow_batches.metrics_text()).total(DEADLINE_EXPIRED_METRIC, MODEL)
        if after > before or time.monotonic() > waited:
            break
        time.sleep(0.2)
    assert after == before + 1


def test_a_malformed_deadline_header_gets_400_naming_it(slow_batches):
    responses = post_all(slow_batches, [{TIMEOUT_HEADER: "soon"}, {}])
    assert [r.status_code for r in responses] == [400, 200]
    assert TIMEOUT_HEADER in responses[0].json()["message"]
