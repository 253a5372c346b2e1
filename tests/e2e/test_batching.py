"""Batches that really form: a second server with batchSize 4 and a 200 ms maxBatchDelay.

Concurrent answers must equal one-by-one answers, and one bad request in a batch gets its 400
while its batch-mates get their 200, without the worker dying. Each test checks its own batches
(a diff of the handler's batch counters) and its own workers: none relies on another having run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from serving import ts_logs
from serving.launcher import TorchServe
from serving.ts_config import ModelSettings
from tests.e2e.conftest import MODELS
from tests.e2e.helpers import (
    Request,
    answered,
    assert_bad_request,
    assert_same_answer,
    bad_cases,
    batches_since,
    examples_of,
    formed_batches,
    post_together,
)

pytestmark = pytest.mark.e2e
BATCH = ModelSettings(batch_size=4, max_batch_delay_ms=200, min_workers=1, max_workers=1)
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


@pytest.mark.parametrize("model", MODELS)
def test_batch_settings_took_effect(batched, model):
    desc = batched.server.describe(model)
    assert (desc["batchSize"], desc["maxBatchDelay"]) == (4, 200), desc


@pytest.mark.parametrize("model", MODELS)
def test_concurrent_answers_equal_one_by_one(batched, unharmed, model):
    server = batched.server
    examples = examples_of(model)
    batch = [r for _, r in examples] * (2 if len(examples) < 4 else 1)
    alone = [answered(server.predict(model, r.body, r.content_type), model) for r in batch]
    before = formed_batches(server, model)
    together = [answered(resp, model) for resp in post_together(server, model, batch)]
    for index, (single, batched_answer) in enumerate(zip(alone, together)):
        assert_same_answer(model, single, batched_answer, f"request {index}")
    assert max(batches_since(server, model, before, len(batch))) >= 2, "no batch of 2+ formed"


BAD = [(model, index) for model in MODELS for index in range(3)]


@pytest.mark.parametrize("model, index", BAD, ids=[f"{m}-{i}" for m, i in BAD])
def test_one_bad_request_in_a_batch(batched, unharmed, model, index):
    """Three valid examples and one request the family's corpus says must be refused, in one batch:
    the bad one gets its 400, its batch-mates their answers."""
    cases = bad_cases(model)
    if index >= len(cases):
        pytest.skip(f"{model}'s family corpus has {len(cases)} such cases")
    case = cases[index]
    examples = (examples_of(model) * 3)[:3]
    batch = [examples[0][1], examples[1][1], Request(case.body, case.content_type), examples[2][1]]
    responses = post_as_one_batch(batched.server, model, batch, accepted=3)
    assert_bad_request(responses[2])
    for (example, _), resp in zip(examples, (responses[0], responses[1], responses[3])):
        answered(resp, model, example)
