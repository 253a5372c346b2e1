"""MiniLM's archive in-process against the independent reference (tests/references.py): the served
embeddings are MiniLM's, in fp32 and in the catalogue's precision, alone or batched."""

import numpy as np
import pytest
import torch

from handlers import runtime
from tests.references import decoded, text_embeddings

from .conftest import make_handler

pytestmark = pytest.mark.archives

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "TorchServe batches requests from many clients into one forward pass of the model.",
]


@pytest.fixture(scope="module")
def reference():
    return text_embeddings(SENTENCES)


@pytest.fixture(scope="module")
def served(archive_dirs):
    return make_handler(archive_dirs["minilm"], "minilm")


@pytest.fixture(scope="module")
def fp32(eager_archive_dirs):
    return make_handler(eager_archive_dirs["minilm"], "minilm", runtime={"precision": "fp32"})


def embed(handler, context, texts):
    answers = decoded(handler.handle([{"body": {"text": t}} for t in texts], context))
    return np.array([a["embedding"] for a in answers])


# The served archive is traced under bf16 autocast where the CPU runs bf16 natively, and in fp32
# where it does not: its bf16 tolerance would then be testing fp32, so that case says so and skips.
BF16 = pytest.mark.skipif(not runtime.cpu_supports(torch.bfloat16),
                          reason="no AVX-512 BF16 on this CPU: the archive is fp32 here, bf16 is not under test")


# Tolerances: fp32 paths must match the reference to float noise; bf16 autocast keeps ~3 significant
# digits per matmul, which still leaves embeddings within cosine 0.99 of fp32.
@pytest.mark.parametrize("fixture, min_cosine", [("fp32", 0.999), pytest.param("served", 0.99, marks=BF16)])
def test_matches_reference(request, fixture, min_cosine, reference):
    handler, context = request.getfixturevalue(fixture)
    vectors = embed(handler, context, SENTENCES)
    assert vectors.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    cosines = (vectors * reference).sum(axis=1)
    assert cosines.min() >= min_cosine, cosines
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3


def test_single_requests_match_batched(served, reference):
    """One request alone (no padding inside the batch) takes the same traced graph correctly."""
    handler, context = served
    for i, text in enumerate(SENTENCES):
        (vector,) = embed(handler, context, [text])
        assert vector @ reference[i] >= 0.99
