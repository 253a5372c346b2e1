"""The response cache through a real TorchServe (minilm, the archive with response_cache on): a
repeated request is answered from the cache with the same bytes, `Cache-Control: no-cache` computes
afresh (the same bytes again), a bad request is refused every time, and the counters reach
Prometheus."""

from __future__ import annotations

import json
import time

import pytest

from benchmarks.bench.archive_settings import with_cache
from benchmarks.load.server_metrics import Scrape
from serving.launcher import TorchServe
from serving.ts_config import ModelSettings

pytestmark = pytest.mark.e2e

MODEL = "minilm"


def test_repeats_come_from_the_cache_byte_identical_and_no_cache_bypasses_it(model_store, tmp_path):
    with_cache(model_store / f"{MODEL}.mar", tmp_path / "store", MODEL, max_mib=4)
    settings = {MODEL: ModelSettings(batch_size=1, max_batch_delay_ms=1)}
    with TorchServe(tmp_path / "store", models=settings, load=(MODEL,)) as server:
        client = server.client
        body = json.dumps({"text": "The for statement is used to iterate."})
        first = client.predict(MODEL, body, "application/json")
        again = client.predict(MODEL, json.dumps({"text": "The for statement is used to iterate."},
                                                 indent=2), "application/json")  # same meaning, other spacing
        fresh = client.predict(MODEL, body, "application/json", headers={"Cache-Control": "no-cache"})
        assert first.status_code == again.status_code == fresh.status_code == 200
        assert again.content == first.content == fresh.content
        for _ in range(2):
            bad = client.predict(MODEL, b'{"text": ', "application/json")
            assert bad.status_code == 400
        deadline = time.monotonic() + 20
        while True:
            scrape = Scrape.of(server.metrics_text())
            if scrape.total("ResponseCacheHits", MODEL) >= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert scrape.total("ResponseCacheHits", MODEL) == 1  # `again`; `fresh` was not looked up
        assert scrape.total("ResponseCacheMisses", MODEL) >= 3  # first and the two bad ones
        assert scrape.total("ResponseCacheBytes", MODEL) > 0
