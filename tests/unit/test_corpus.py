"""The bad-input corpus, in-process on tiny models of every family: every case gets its outcome,
alone and mixed into batches.

The same corpus runs against a real TorchServe in tests/e2e/test_reliability.py; here the worker's
own decoding of text and JSON bodies is reproduced by `worker_input`, and form bodies (which the
frontend splits into fields) are left to the e2e run.
"""

import json
import logging
import random
from collections import Counter

import pytest
import requests

from benchmarks.reliability.badinput import nowhere_cases, well_formed
from benchmarks.reliability.corpus import HANDLER, family_cases, server_cases
from build.examples import worker_input
from handlers.errors import ConfigError
from handlers.families import FAMILIES
from handlers.families.image_settings import ImageSettings
from handlers.families.text_embedder import TextSettings
from tests.references import decoded
from tests.tiny import catalogue_entries

from .conftest import make_handler

pytestmark = pytest.mark.unit

BATCH = 6
# A tiny model of each family (tests/tiny.py) gets its family's corpus, built from the model's own
# settings; a generating model's bad requests: tests/unit/test_generation.py.
MODELS = [name for name, entry in catalogue_entries().items() if not FAMILIES[entry["family"]].generates]


@pytest.fixture(scope="module")
def handlers(tiny_dirs):
    return {model: make_handler(tiny_dirs[model], model, batch_size=BATCH) for model in MODELS}


def test_corpus_size_and_coverage():
    image, text = "image_classifier", "text_embedder"
    everything = family_cases(image, ImageSettings()) + family_cases(text, TextSettings()) + server_cases(
        image, 1000, 500) + [
        case for _, case in nowhere_cases()]
    assert len(everything) >= 150
    sources = Counter(c.source for c in everything)
    assert sources["hand"] >= 100 and sources["generated"] >= 100, sources
    assert sum(c.valid for c in everything) >= 50
    names = " ".join(c.name.lower() for c in everything)
    for kind in ("random bytes", " cut ", "declares", "zero", "greyscale", "cmyk", "rgba", "alpha", "16-bit",
                 "empty", "over the", "content type", "json", "nested", "nan", "utf-8", "control", "1x1",
                 "surrogate", "multipart", "unknown model"):
        assert kind in names, f"no {kind!r} case in the corpus"


def answer_ok(settings, answer) -> bool:
    response = requests.Response()
    response._content, response.status_code = json.dumps(answer).encode(), 200
    return well_formed(settings, response)


def run_batch(handler, context, batch):
    context.statuses.clear()
    context.headers = {i: {"Content-Type": c.content_type} for i, c in enumerate(batch) if c.content_type}
    answers = decoded(handler.handle([{"body": worker_input(c.body, c.content_type)} for c in batch], context))
    failures = []
    for i, (case, answer) in enumerate(zip(batch, answers)):
        status, _ = context.statuses.get(i, (200, ""))
        message = answer.get("message", "") if status != 200 and isinstance(answer, dict) else ""
        if not case.outcome_ok(status, message) or (case.valid and not answer_ok(handler.settings, answer)):
            failures.append(f"{case!r} -> {status} {message[:120]}")
        if not case.valid:
            assert answer["code"] == status and answer["type"] and answer["message"], case
    return failures


@pytest.mark.parametrize("model", MODELS)
def test_every_case_in_mixed_batches(handlers, model, caplog):
    """Each case of the model's family gets its outcome, shuffled into batches: an invalid request
    never costs its valid batch-mates their answer."""
    handler, context = handlers[model]
    settings = handler.settings
    mine = [c for c in family_cases(settings.family, settings.family_settings)
            if c.layer == HANDLER and not c.form_encoded]
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


def tiny_settings(family: str):
    """The family settings of the tiny catalogue's model of `family` (tests/tiny.py)."""
    from handlers.settings import parse_section
    from tests.tiny import catalogue_entries

    entry = next(e for e in catalogue_entries().values() if e["family"] == family)
    return parse_section(FAMILIES[family].Settings, entry["settings"].get(family), family)


def test_an_unknown_family_is_an_error_not_an_empty_corpus():
    with pytest.raises(ConfigError, match="'no_such_family' is not one of"):
        family_cases("no_such_family", None)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_writes_cases_of_both_kinds_under_its_own_name(family):
    cases = family_cases(family, tiny_settings(family))
    assert {c.family for c in cases} == {family}
    assert sum(c.valid for c in cases) >= 3 and sum(not c.valid for c in cases) >= 10
    assert len({c.name for c in cases}) == len(cases)
