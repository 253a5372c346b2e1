"""Worker batching through a real TorchServe: minilm's archive copied with `runtime.batching: worker`
(TorchServe's asynchronous mode: the frontend forwards each request at once, the worker forms the
batches) beside a copy left to frontend batching, on one server.

Concurrent requests, a bad one among them, get the frontend-batching copy's answers (the bad one its
400 on both); batches of more than one request formed in the worker (its HandlerBatches counter);
the worker lives on.

Both copies carry this checkout's handlers package: the model files are the built archive's, so the
handler code under test needs no rebuild of model_store/.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from benchmarks.bench.archive_settings import MANIFEST, with_handler_settings
from build.archive import HANDLERS, build_entry
from build.catalogue import Catalogue
from serving.launcher import TorchServe
from serving.repo import CATALOGUE, MODEL_STORE, REPO_ROOT
from serving.ts_config import ModelSettings
from tests.e2e.helpers import (
    Request,
    assert_bad_request,
    assert_same_answer,
    batches_since,
    formed_batches,
    post_together,
)

pytestmark = pytest.mark.e2e

MODEL = "minilm"
WORKER = f"{MODEL}_worker"
BATCH = 8
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome.",
         "A woman is playing the violin.", "TorchServe batches requests.", "Revenue grows faster than costs.",
         "The for statement is used to iterate.", "A cat sleeps on the warm windowsill."]
BAD = Request(b'{"text": ', "application/json")


def with_checkout_handlers(archive: Path) -> None:
    """Replace the archive's handlers package, and the root copy TorchServe imports its handler from,
    with this checkout's."""
    with zipfile.ZipFile(archive) as old:
        entry = json.loads(old.read(MANIFEST))["model"]["handler"]
        kept = [(item, old.read(item)) for item in old.infolist()
                if not item.filename.startswith("handlers/") and item.filename != entry]
    ours = sorted(p for p in HANDLERS.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as new:
        for item, data in kept:
            new.writestr(item, data)
        for path in ours:
            new.write(path, f"handlers/{path.relative_to(HANDLERS).as_posix()}")
        new.write(HANDLERS / entry, entry)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not (MODEL_STORE / f"{MODEL}.mar").is_file():
        build_entry(Catalogue.load(CATALOGUE), MODEL, REPO_ROOT, MODEL_STORE, progress=print)
    store = tmp_path_factory.mktemp("worker-batching")
    with_handler_settings(MODEL_STORE / f"{MODEL}.mar", store, MODEL, {})
    with_handler_settings(MODEL_STORE / f"{MODEL}.mar", store, WORKER,
                          {"runtime": {"batching": "worker", "worker_batch_size": BATCH, "batch_window_ms": 50}})
    for name in (MODEL, WORKER):
        with_checkout_handlers(store / f"{name}.mar")
    one_worker = {"min_workers": 1, "max_workers": 1, "threads": 1}
    models = {MODEL: ModelSettings(batch_size=BATCH, max_batch_delay_ms=50, **one_worker),
              WORKER: ModelSettings(batch_size=1, max_batch_delay_ms=1, **one_worker)}  # worker mode: forward at once
    with TorchServe(store, models=models, load=(MODEL, WORKER)) as ts:
        yield ts


def test_concurrent_requests_get_the_frontend_batching_answers_and_batches_form_in_the_worker(server):
    batch = [Request(json.dumps({"text": t}).encode(), "application/json") for t in TEXTS]
    batch.insert(3, BAD)
    pids = server.worker_pids(WORKER)
    expected = post_together(server, MODEL, batch)
    before = formed_batches(server, WORKER)
    answers = post_together(server, WORKER, batch)
    formed = batches_since(server, WORKER, before, len(TEXTS))

    for i, (got, want) in enumerate(zip(answers, expected)):
        if batch[i] is BAD:
            assert_bad_request(got)
            assert_bad_request(want)
        else:
            assert got.status_code == want.status_code == 200, (got.text, want.text)
            assert_same_answer(MODEL, got.json(), want.json(), f"request {i}")
    assert sum(size * n for size, n in formed.items()) == len(TEXTS), formed
    assert max(formed) > 1, f"the worker formed no batch of more than one request: {formed}"
    assert server.worker_pids(WORKER) == pids  # the bad request cost the worker nothing
