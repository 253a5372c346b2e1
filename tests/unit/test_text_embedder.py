"""Text handler on a tiny random-weight BERT (tests/tiny.py): pooling, the normalize setting, a request
alone == in a batch, padding buckets, truncation, body forms, bad inputs in a batch. Agreement with
the real MiniLM's reference embeddings: tests/archives."""

import numpy as np
import pytest
import torch

from handlers.families.pooling import mean_pool
from tests.references import decoded
from tests.tiny import TEXT_WIDTH

from .conftest import make_handler

pytestmark = pytest.mark.unit

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "TorchServe batches requests from many clients into one forward pass of the model.",
]


@pytest.fixture(scope="module")
def served(tiny_dirs):
    return make_handler(tiny_dirs["tiny_text"], "tiny_text")


def embed(handler, context, texts):
    answers = decoded(handler.handle([{"body": {"text": t}} for t in texts], context))
    return np.array([a["embedding"] for a in answers])


@pytest.fixture(scope="module")
def alone(served):
    """Each sentence's embedding when it is the only request of its batch (no padding)."""
    return np.concatenate([embed(*served, [text]) for text in SENTENCES])


def test_mean_pool_arithmetic():
    """Padding excluded from the mean, then unit length: checked against numbers worked by hand."""
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]], [[2.0, 0.0], [9.0, 9.0], [9.0, 9.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    np.testing.assert_allclose(mean_pool(hidden, mask, normalize=False).numpy(), [[2.0, 3.0], [2.0, 0.0]])
    np.testing.assert_allclose(mean_pool(hidden, mask).numpy(), [[2 / 13 ** 0.5, 3 / 13 ** 0.5], [1.0, 0.0]], rtol=1e-6)


def test_normalize_setting_is_honoured(served, tiny_dirs):
    """normalize: false gives the raw mean-pooled vectors (same direction, not unit length)."""
    raw, context = make_handler(tiny_dirs["tiny_text"], "tiny_text", text_embedder={"normalize": False})
    unit, vectors = embed(*served, SENTENCES[:2]), embed(raw, context, SENTENCES[:2])
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    norms = np.linalg.norm(vectors, axis=1)
    assert (abs(norms - 1.0) > 0.1).all()
    np.testing.assert_allclose(vectors / norms[:, None], unit, atol=1e-5)


def test_single_requests_match_batched(served, alone):
    """A batch pads its shorter sentences: each one's embedding is what it gets alone, unpadded."""
    batched = embed(*served, SENTENCES)
    assert batched.shape == (len(SENTENCES), TEXT_WIDTH)
    assert len({len(served[0].family.tokenizer.encode(s).ids) for s in SENTENCES}) > 1  # padding did happen
    np.testing.assert_allclose(batched, alone, atol=1e-5)


def test_dynamic_padding_to_bucket(served):
    handler, _ = served
    settings = handler.settings.family_settings
    texts = ["A cat", "The new movie is awesome."]
    longest = max(len(handler.family.tokenizer.encode(t).ids) for t in texts)
    ids, mask = handler.family.collate(texts)
    assert ids.shape[1] % settings.pad_bucket == 0 and longest <= ids.shape[1] < longest + settings.pad_bucket
    assert ids.shape[1] < settings.max_length and mask[0].sum() < mask[1].sum()
    long_ids, _ = handler.family.collate(["word " * 1000])
    assert long_ids.shape[1] == settings.max_length  # truncated to the model's limit, not rejected


def test_over_long_text_is_truncated_not_rejected(served):
    handler, context = served
    answer = decoded(handler.handle([{"body": "lorem ipsum " * 50000}], context))[0]
    assert len(answer["embedding"]) == TEXT_WIDTH and 0 not in context.statuses


def test_plain_text_and_json_bytes(served, alone):
    handler, context = served
    context.headers = {0: {"Content-Type": "text/plain; charset=utf-8"}, 1: {"content-type": "application/json"}}
    answers = decoded(handler.handle([{"body": SENTENCES[0].encode()}, {"body": b'{"text": "A man is eating food."}'}], context))
    for answer in answers:
        np.testing.assert_allclose(answer["embedding"], alone[0], atol=1e-5)
    context.headers = {}


BAD = [
    ({"body": b""}, {}, 400, "empty"),
    ({"body": b'{"text": '}, {"Content-Type": "application/json"}, 400, "malformed JSON"),
    ({"body": {"txt": "hi"}}, {}, 400, '"text" field'),
    ({"body": {"text": 3}}, {}, 400, "must be a string"),
    ({"body": {"text": float("nan")}}, {}, 400, "must be a string"),
    ({"body": [1, 2]}, {}, 400, "got JSON list"),
    ({"body": b"\xff\xfe\x00"}, {"Content-Type": "text/plain"}, 400, "not valid UTF-8"),
    ({"body": {"text": "   "}}, {}, 400, "empty"),
    ({"body": b"x" * (1024 * 1024 + 1)}, {}, 413, "over the limit"),
    ({"body": b"<a/>"}, {"Content-Type": "application/xml"}, 415, "not supported"),
]


def test_bad_inputs_fail_alone(served, alone):
    handler, context = served
    batch = [{"body": {"text": SENTENCES[0]}}] + [request for request, _, _, _ in BAD] + [{"body": SENTENCES[1]}]
    context.headers = {i: headers for i, (_, headers, _, _) in enumerate(BAD, start=1)}
    answers = decoded(handler.handle(batch, context))
    for i, (_, _, status, words) in enumerate(BAD, start=1):
        assert context.statuses[i][0] == status and answers[i]["code"] == status, answers[i]
        assert words in answers[i]["message"], answers[i]
    np.testing.assert_allclose(answers[0]["embedding"], alone[0], atol=1e-5)
    np.testing.assert_allclose(answers[-1]["embedding"], alone[1], atol=1e-5)
    assert 0 not in context.statuses and len(batch) - 1 not in context.statuses
    context.headers, context.statuses = {}, {}
