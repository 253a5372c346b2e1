"""ENABLE_TORCH_PROFILER=true through a real TorchServe: Chrome traces with our stage regions;
stage timings and formed batch sizes on the Prometheus endpoint."""

import json
import time

import pytest

from benchmarks.load.inputs import requests as example_requests
from benchmarks.load.server_metrics import BATCHES, ITEMS, STAGE_COUNTERS, Scrape
from build.archive import build_entry
from build.catalogue import Catalogue
from serving.launcher import TorchServe
from serving.repo import CATALOGUE, MODEL_STORE, REPO_ROOT
from serving.ts_config import ModelSettings

pytestmark = pytest.mark.e2e

MODEL = Catalogue.load(CATALOGUE).names[0]  # any catalogue model: the profiler is the same for all


@pytest.fixture(scope="module")
def profiled_server():
    build_entry(Catalogue.load(CATALOGUE), MODEL, REPO_ROOT, MODEL_STORE, progress=print)
    # One worker: the profiler's schedule counts the batches of its own worker, and the tuned
    # config.properties may spread a few requests over several.
    one_worker = {MODEL: ModelSettings(batch_size=8, max_batch_delay_ms=5, min_workers=1, max_workers=1)}
    with TorchServe(MODEL_STORE, models=one_worker, load=(MODEL,),
                    env={"ENABLE_TORCH_PROFILER": "true"}) as server:
        yield server


def test_trace_has_stage_regions(profiled_server):
    examples = example_requests(MODEL)
    # Schedule wait 1 + warm-up 1 + active 3: the trace is written after the fifth batch.
    for i in range(8):
        request = examples[i % len(examples)]
        response = profiled_server.predict(MODEL, request.body, request.content_type)
        assert response.status_code == 200, response.text
    trace_dir = profiled_server.workdir / "logs" / "torch_profiler" / MODEL
    traces = sorted(trace_dir.glob("trace-*.json"))
    assert traces, f"no trace in {trace_dir}"
    events = json.loads(traces[0].read_text())["traceEvents"]
    names = {event.get("name") for event in events}
    assert {"preprocess", "inference", "postprocess"} <= names
    assert "top operators" in profiled_server.log_text("model_log.log")


def test_stage_metrics_on_prometheus(profiled_server):
    before = profiled_server.metrics_text()
    for request in (list(example_requests(MODEL)) * 3)[:3]:
        assert profiled_server.predict(MODEL, request.body, request.content_type).status_code == 200
    # Workers report metrics through their log stream: the frontend may count the last batch a
    # moment after its response went out, so read until all three requests are in (bounded).
    deadline = time.monotonic() + 10
    while True:
        after = profiled_server.metrics_text()
        added = Scrape.of(after).total(ITEMS, MODEL) - Scrape.of(before).total(ITEMS, MODEL)
        if added >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert added == 3
    for stage in STAGE_COUNTERS.values():
        assert Scrape.of(after).total(stage, MODEL) > Scrape.of(before).total(stage, MODEL), stage
    sizes = Scrape.of(after).by_label(BATCHES, MODEL, "BatchSize")
    assert sizes and all(1 <= int(size) <= 8 for size in sizes)
