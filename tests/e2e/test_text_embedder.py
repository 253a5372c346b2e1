"""minilm through the real server: {"text": ...} or text/plain in, a 384-d unit vector out."""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.helpers import assert_bad_request, cosine, embedding
from tests.references import text_embeddings

pytestmark = pytest.mark.e2e
MODEL = "minilm"
TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "TorchServe batches requests before they reach the handler.",
    "Ein Satz auf Deutsch, mit Umlauten: schön, groß, Übung.",
]


@pytest.fixture(scope="module")
def reference():
    return text_embeddings(TEXTS)


def test_embeddings_match_reference(server, reference):
    for text, expected in zip(TEXTS, reference):
        served = embedding(server.predict(MODEL, {"text": text}))
        assert abs(np.linalg.norm(served) - 1.0) < 1e-3
        assert cosine(served, expected) >= 0.999, text


def test_paraphrase_closer_than_unrelated(server):
    anchor, paraphrase, unrelated = (embedding(server.predict(MODEL, {"text": t})) for t in TEXTS[:3])
    assert cosine(anchor, paraphrase) > cosine(anchor, unrelated) + 0.2


def test_text_plain_equals_json(server):
    from_json = embedding(server.predict(MODEL, {"text": TEXTS[0]}))
    from_plain = embedding(server.predict(MODEL, TEXTS[0], "text/plain; charset=utf-8"))
    assert cosine(from_json, from_plain) >= 0.9999


@pytest.mark.parametrize(
    "body, ctype",
    [
        (b"", "application/json"),
        (b"{not json", "application/json"),
        (b'{"txt": 1}', "application/json"),
        (b'{"text": 42}', "application/json"),
        (b"\xff\xfe", "text/plain"),
    ],
    ids=["empty", "malformed-json", "missing-text", "text-not-string", "invalid-utf8"],
)
def test_bad_text_is_400(server, body, ctype):
    assert_bad_request(server.predict(MODEL, body, ctype))
    embedding(server.predict(MODEL, {"text": "the worker still answers"}))
