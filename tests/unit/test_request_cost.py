"""A request's cost is bounded the same way on every route: at most MAX_INSTANCES inputs
(handlers/limits.py), and a text embedder's batch runs in groups of like length, so one long text
does not make every short one of its batch cost as much (handlers/families/length_groups.py)."""

import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from handlers.families.length_groups import length_groups, padded
from handlers.limits import MAX_INSTANCES
from handlers.openai.embeddings import MAX_INPUTS, parse_embeddings
from handlers.openai.errors import OpenAIError
from tests.references import decoded

from .conftest import make_handler
from .test_fuzz_inputs import FUZZ

pytestmark = pytest.mark.unit

LONG = " ".join(["the for statement is used to iterate over the elements of a sequence"] * 20)


@pytest.fixture(scope="module")
def served(tiny_dirs):
    return make_handler(tiny_dirs["tiny_text"], "tiny_text", batch_size=8)


def test_openai_embeddings_take_at_most_the_routes_shared_limit():
    """Was: 2048 texts per request (OpenAI's own limit) while the KServe routes took 64."""
    assert MAX_INPUTS == MAX_INSTANCES == 64
    parse_embeddings({"model": "m", "input": ["a"] * MAX_INSTANCES}, "m")
    with pytest.raises(OpenAIError, match="65 texts, over the limit of 64") as refused:
        parse_embeddings({"model": "m", "input": ["a"] * (MAX_INSTANCES + 1)}, "m")
    assert refused.value.param == "input" and refused.value.status == 400


def cost(groups) -> int:
    return sum(len(rows) * width for rows, width in groups)


@FUZZ
@given(lengths=st.lists(st.integers(0, 300), max_size=80), bucket=st.sampled_from([1, 8, 16]),
       pass_cost=st.integers(0, 500))
def test_length_groups_cover_each_row_once_at_no_more_cost(lengths, bucket, pass_cost):
    groups = length_groups(lengths, bucket, pass_cost)
    assert sorted(row for rows, _ in groups for row in rows) == list(range(len(lengths)))
    assert all(padded(lengths[row], bucket) <= width for rows, width in groups for row in rows)
    assert len(groups) <= len({padded(n, bucket) for n in lengths})
    if lengths:  # never dearer than one pass at the longest width
        one_pass = pass_cost + len(lengths) * max(padded(n, bucket) for n in lengths)
        assert cost(groups) + pass_cost * len(groups) <= one_pass


def test_one_long_text_pads_only_itself():
    """1 text of 256 tokens and 31 of 3: 256 + 31 x 16 padded tokens, not 32 x 256."""
    groups = length_groups([256] + [3] * 31, 16, 64)
    assert cost(groups) == 256 + 31 * 16
    assert length_groups([14, 18, 12, 20], 16, 64) == [([0, 1, 2, 3], 32)]  # like lengths: one pass


def test_the_embedder_runs_a_mixed_batch_in_groups_with_the_same_answers(served):
    """The hostile OpenAI request's batch (1 long text, 31 short ones) through the model in-process:
    the passes' padded tokens are the texts' own, and every embedding is what one pass gives."""
    handler, _ = served
    family = handler.family
    batch = family.collate([LONG] + ["a"] * 31)
    shapes = []

    def forward(part):
        shapes.append(tuple(part[0].shape))
        return handler.infer(part)

    grouped = family.run(forward, batch)
    width = batch[0].shape[1]
    assert sum(rows * cols for rows, cols in shapes) < 32 * width / 3, shapes  # was: one pass of 32 x width
    np.testing.assert_allclose(grouped.numpy(), handler.infer(batch).numpy(), atol=1e-5)


def test_the_openai_route_answers_the_same_texts_the_same_way(served):
    """The whole route in-process: one long text among 31 short ones, answered in order, each as alone."""
    handler, context = served
    texts = [LONG] + ["a", "b c", "a longer text of several words"] * 10 + ["z"]
    context.headers, context.statuses = {0: {"url_path": "v1/embeddings"}}, {}
    answer = json.loads(handler.handle([{"body": {"model": "tiny_text", "input": texts}}], context)[0])
    assert not context.statuses
    vectors = [row["embedding"] for row in answer["data"]]
    for i in (0, 1, 2, 31):
        context.headers, context.statuses = {0: {"Content-Type": "text/plain"}}, {}
        alone = decoded(handler.handle([{"body": texts[i]}], context))[0]["embedding"]
        np.testing.assert_allclose(vectors[i], alone, atol=1e-5)


def test_the_naive_path_stays_one_pass(tiny_dirs):
    handler, _ = make_handler(tiny_dirs["tiny_text"], "tiny_text", text_embedder={"pad_to_max_length": True})
    calls = []
    handler.family.run(lambda part: calls.append(part) or torch.zeros(len(part[0]), 4),
                       handler.family.collate([LONG, "a"]))
    assert len(calls) == 1
