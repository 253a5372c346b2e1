"""Batches that really form: a second server with batchSize 4 and a 200 ms maxBatchDelay.

Concurrent answers must equal one-by-one answers, and one bad request in a batch gets its 400
while its batch-mates get their 200, without the worker dying. Each test checks its own batches
(a diff of the handler's batch counters) and its own workers: none relies on another having run.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest

from benchmarks.load.inputs import CAT_LABELS
from benchmarks.serving import ts_logs
from benchmarks.serving.launcher import TorchServe
from benchmarks.serving.ts_config import ModelSettings
from tests.e2e.conftest import MODELS
from tests.e2e.helpers import (
    Request,
    assert_bad_request,
    batches_since,
    cosine,
    embedding,
    formed_batches,
    jpeg_of,
    post_together,
    top5,
)

pytestmark = pytest.mark.e2e
BATCH = ModelSettings(batch_size=4, max_batch_delay_ms=200, min_workers=1, max_workers=1)
IMAGE, TEXT = MODELS
TRIES = 3


@dataclass(frozen=True)
class Batched:
    server: TorchServe
    pids: dict[str, tuple[int, ...]]


@pytest.fixture(scope="module")
def batched(model_store, root_config):
    models = {name: BATCH for name in MODELS}
    with TorchServe(model_store, base_config=root_config.path, models=models, wait_for=MODELS) as ts:
        yield Batched(ts, {name: ts.worker_pids(name) for name in MODELS})


@pytest.fixture()
def unharmed(batched):
    """After the test: the same worker processes as at start, and no worker death logged meanwhile."""
    marks = {name: len(batched.server.log_text(name)) for name in ("model_log.log", "ts_log.log")}
    yield batched.server
    for name in MODELS:
        assert batched.server.worker_pids(name) == batched.pids[name], name
    for log, mark in marks.items():
        deaths = ts_logs.worker_deaths(batched.server.log_text(log)[mark:])
        assert not deaths, "\n".join(deaths[:10])


def post_as_one_batch(server: TorchServe, model: str, batch: list[Request], accepted: int):
    """Post `batch` together until the frontend formed exactly one batch of it (the handler counts
    a batch by its `accepted` valid requests); up to TRIES tries. Returns that try's responses."""
    formed = {}
    for _ in range(TRIES):
        before = formed_batches(server, model)
        responses = post_together(server, model, batch)
        formed = batches_since(server, model, before, accepted)
        time.sleep(0.5)  # a batch of refused requests only (size 0) may still be reporting
        formed = batches_since(server, model, before, accepted)
        if formed == {accepted: 1}:
            return responses
    pytest.fail(f"{len(batch)} requests posted together never formed one batch in {TRIES} tries (last: {formed})")


@pytest.fixture(scope="module")
def images(cat_png, coffee_png):
    cat, coffee = cat_png.read_bytes(), coffee_png.read_bytes()
    cat_jpeg, coffee_jpeg = jpeg_of(cat_png), jpeg_of(coffee_png)
    return [
        Request(cat, "image/png"),
        Request(coffee, "image/png"),
        Request(cat_jpeg, "image/jpeg"),
        Request(coffee_jpeg, "image/jpeg"),
        Request(jpeg_of(cat_png, quality=60), "image/jpeg"),
        Request(jpeg_of(coffee_png, quality=60), "image/jpeg"),
        Request(cat, "image/png"),
        Request(coffee_jpeg, "image/jpeg"),
    ]


TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "A cheetah is running behind its prey.",
    "short",
    "A somewhat longer sentence, so that the batch holds sequences of different lengths and padding matters.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
]


def test_batch_settings_took_effect(batched):
    for name in MODELS:
        desc = batched.server.describe(name)
        assert (desc["batchSize"], desc["maxBatchDelay"]) == (4, 200), desc


def test_concurrent_images_equal_one_by_one(batched, unharmed, images):
    server = batched.server
    alone = [top5(server.predict(IMAGE, r.body, r.content_type)) for r in images]
    before = formed_batches(server, IMAGE)
    together = [top5(resp) for resp in post_together(server, IMAGE, images)]
    for single, batch in zip(alone, together):
        assert list(single) == list(batch), (single, batch)
        for label, prob in single.items():
            assert abs(prob - batch[label]) <= 1e-4, (label, prob, batch[label])
    assert next(iter(alone[0])) in CAT_LABELS and next(iter(alone[1])) == "espresso"
    assert max(batches_since(server, IMAGE, before, len(images))) >= 2, "no batch of 2+ formed"


def test_concurrent_texts_equal_one_by_one(batched, unharmed):
    server = batched.server
    alone = [embedding(server.predict(TEXT, {"text": t})) for t in TEXTS]
    requests_ = [Request(json.dumps({"text": t}).encode(), "application/json") for t in TEXTS]
    before = formed_batches(server, TEXT)
    together = [embedding(resp) for resp in post_together(server, TEXT, requests_)]
    for text, single, batch in zip(TEXTS, alone, together):
        assert cosine(single, batch) >= 0.9999, text
    assert max(batches_since(server, TEXT, before, len(TEXTS))) >= 2, "no batch of 2+ formed"


BAD_IMAGES = {
    "not-an-image": Request(b"not an image", "image/png"),
    "empty": Request(b"", "image/png"),
    "truncated-png": None,  # built from the cat photo below
}
BAD_TEXTS = {
    "missing-text": Request(b'{"txt": 1}', "application/json"),
    "malformed-json": Request(b'{"text": ', "application/json"),
    "invalid-utf8": Request(b"\xff\xfe", "text/plain"),
    "empty": Request(b"", "text/plain"),
}


@pytest.mark.parametrize("kind", list(BAD_IMAGES))
def test_one_bad_image_in_a_batch(batched, unharmed, images, kind):
    bad = BAD_IMAGES[kind] or Request(images[0].body[: len(images[0].body) // 2], "image/png")
    responses = post_as_one_batch(batched.server, IMAGE, [images[0], images[1], bad, images[2]], accepted=3)
    assert_bad_request(responses[2])
    assert next(iter(top5(responses[0]))) in CAT_LABELS
    assert next(iter(top5(responses[1]))) == "espresso"
    assert next(iter(top5(responses[3]))) in CAT_LABELS


@pytest.mark.parametrize("kind", list(BAD_TEXTS))
def test_one_bad_text_in_a_batch(batched, unharmed, kind):
    good = [Request(json.dumps({"text": t}).encode(), "application/json") for t in TEXTS[:3]]
    responses = post_as_one_batch(batched.server, TEXT, [good[0], BAD_TEXTS[kind], good[1], good[2]], accepted=3)
    assert_bad_request(responses[1])
    for resp in (responses[0], responses[2], responses[3]):
        embedding(resp)
