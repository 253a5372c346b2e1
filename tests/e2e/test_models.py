"""Every catalogue model through the real server: its examples answered with the family's shape
(and the expected top-1 where the catalogue gives one), exactly as the same archive answers
in-process; bad requests refused with a 400 that says why, the worker still answering after."""

from __future__ import annotations

import numpy as np
import pytest

from build.catalogue import Catalogue
from build.sources import HuggingFaceFolder
from serving.repo import CATALOGUE, REPO_ROOT
from tests.e2e.conftest import MODELS
from tests.e2e.helpers import (
    answered,
    assert_bad_request,
    assert_same_answer,
    bad_cases,
    cosine,
    examples_of,
    inprocess_answers,
)

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("model", MODELS)
def test_examples_answered_as_in_process(server, model, tmp_path):
    examples = examples_of(model)
    assert examples, f"{model} has no catalogue examples"
    served = [answered(server.predict(model, r.body, r.content_type), model, e) for e, r in examples]
    alone = inprocess_answers(model, [r for _, r in examples], tmp_path)
    for (example, _), one, other in zip(examples, served, alone):
        assert_same_answer(model, one, other, example.name)


@pytest.mark.parametrize("model", MODELS)
def test_bad_requests_are_400_and_the_worker_lives(server, model):
    example, good = examples_of(model)[0]
    cases = bad_cases(model)
    assert cases, f"no bad-input cases for {model}'s family"
    for case in cases:
        assert_bad_request(server.predict(model, case.body, case.content_type))
        answered(server.predict(model, good.body, good.content_type), model, example)


TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome.",
         "TorchServe batches requests before they reach the handler.",
         "Ein Satz auf Deutsch, mit Umlauten: schön, groß, Übung."]
HF_TEXT_MODELS = [m for m in MODELS if isinstance(Catalogue.load(CATALOGUE).entry(m).model, HuggingFaceFolder)]


@pytest.mark.parametrize("model", HF_TEXT_MODELS)
def test_embeddings_match_the_reference(server, model):
    """Hugging Face's own tokenizer and model from the same folder, fp32, against the served path."""
    from tests.references import text_embeddings

    folder = Catalogue.load(CATALOGUE).entry(model).model.folder(REPO_ROOT)
    reference = text_embeddings(TEXTS, folder)
    served = [np.asarray(answered(server.predict(model, {"text": t}), model)["embedding"]) for t in TEXTS]
    for text, vector, expected in zip(TEXTS, served, reference):
        assert abs(np.linalg.norm(vector) - 1.0) < 1e-3
        assert cosine(vector, expected) >= 0.999, text
    assert cosine(served[0], served[1]) > cosine(served[0], served[2]) + 0.2  # paraphrase closer than unrelated
    plain = answered(server.predict(model, TEXTS[0], "text/plain; charset=utf-8"), model)
    assert cosine(np.asarray(plain["embedding"]), served[0]) >= 0.9999
