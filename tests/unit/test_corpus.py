"""The bad-input corpus, in-process: every case gets its outcome, alone and mixed into batches.

The same corpus runs against a real TorchServe in tests/e2e/test_reliability.py; here the worker's
own decoding of text and JSON bodies is reproduced by `worker_input`, and form bodies (which the
frontend splits into fields) are left to the e2e run.
"""

import logging
import random
from collections import Counter

import pytest

from benchmarks.reliability.corpus import HANDLER, IMAGE_MODEL, TEXT_MODEL, cases, handler_cases, worker_input
from handlers.image_classifier import ImageClassifier
from handlers.text_embedder import TextEmbedder

from .conftest import make_handler

pytestmark = pytest.mark.unit

BATCH = 6


@pytest.fixture(scope="module")
def corpus():
    return [c for c in handler_cases() if not c.form_encoded]


@pytest.fixture(scope="module")
def handlers(archive_dirs):
    return {
        IMAGE_MODEL: make_handler(ImageClassifier, archive_dirs[IMAGE_MODEL], IMAGE_MODEL, batch_size=BATCH),
        TEXT_MODEL: make_handler(TextEmbedder, archive_dirs[TEXT_MODEL], TEXT_MODEL, batch_size=BATCH),
    }


def test_corpus_size_and_coverage():
    everything = cases()
    assert len(everything) >= 150
    sources = Counter(c.source for c in everything)
    assert sources["hand"] >= 100 and sources["generated"] >= 100, sources
    assert sum(c.valid for c in everything) >= 50
    names = " ".join(c.name.lower() for c in everything)
    for kind in ("random bytes", " cut ", "declares", "zero", "greyscale", "cmyk", "rgba", "alpha", "16-bit",
                 "empty", "over the", "content type", "json", "nested", "nan", "utf-8", "control", "1x1",
                 "surrogate", "multipart", "unknown model"):
        assert kind in names, f"no {kind!r} case in the corpus"


def answer_ok(model, answer) -> bool:
    if model == IMAGE_MODEL:
        return isinstance(answer, dict) and len(answer) == 5 and all(0 <= p <= 1 for p in answer.values())
    return isinstance(answer, dict) and len(answer.get("embedding", ())) == 384


def run_batch(handler, context, batch):
    context.statuses.clear()
    context.headers = {i: {"Content-Type": c.content_type} for i, c in enumerate(batch) if c.content_type}
    answers = handler.handle([{"body": worker_input(c.body, c.content_type)} for c in batch], context)
    failures = []
    for i, (case, answer) in enumerate(zip(batch, answers)):
        status, _ = context.statuses.get(i, (200, ""))
        message = answer.get("message", "") if status != 200 and isinstance(answer, dict) else ""
        if not case.outcome_ok(status, message) or (case.valid and not answer_ok(case.model, answer)):
            failures.append(f"{case!r} -> {status} {message[:120]}")
        if not case.valid:
            assert answer["code"] == status and answer["type"] and answer["message"], case
    return failures


@pytest.mark.parametrize("model", [IMAGE_MODEL, TEXT_MODEL])
def test_every_case_in_mixed_batches(handlers, corpus, model, caplog):
    """Each case gets its outcome, shuffled into batches: an invalid request never costs its valid
    batch-mates their answer."""
    handler, context = handlers[model]
    mine = [c for c in corpus if c.model == model and c.layer == HANDLER]
    valid = [c for c in mine if c.valid]
    random.Random(7).shuffle(mine)
    failures, mixed = [], 0
    for start in range(0, len(mine), BATCH - 1):
        # One valid case in every batch, so each batch holds both kinds.
        batch = mine[start:start + BATCH - 1] + [valid[start % len(valid)]]
        mixed += any(c.valid for c in batch) and not all(c.valid for c in batch)
        with caplog.at_level(logging.ERROR):
            failures += run_batch(handler, context, batch)
    assert not failures, "\n".join(failures)
    assert mixed >= len(mine) // BATCH
    # Every bad input is one the handlers foresee: none reaches the catch-all "could not be read".
    assert not [r for r in caplog.records if "unexpected error" in r.getMessage()]
