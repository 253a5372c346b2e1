"""Hostile bodies at /predictions, every model: the families' own cases, mutated examples, random
JSON and bytes under every content type, forms, odd .npy files and images (tests/e2e/hostile/bodies.py);
the text embedder also with its response cache on; the causal LM with odd lengths and stop strings."""

from __future__ import annotations

import json
from functools import cache

import pytest
from hypothesis import strategies as st

from tests.e2e.conftest import LM, MODELS
from tests.e2e.hostile import answers, bodies
from tests.e2e.hostile.conftest import CACHED, EMBEDDER
from tests.e2e.hostile.contract import ANSWER, Batches, Contract, Expect, Probe, Request, RunningPeak, attack
from tests.e2e.hostile.mates import JSON, PROMPTS, cached_mates, canary, rest_mates

pytestmark = pytest.mark.e2e

EXAMPLES = 12


def prober(served: str, model: str):
    """Body -> Probe at /predictions/<served>: a 200 must be one well-formed answer of `model`'s family."""
    def probe(body: bodies.Body) -> Probe:
        return Probe(Request(f"/predictions/{served}", body.data, body.content_type, body.headers), body.expect,
                     answers.well_formed(model, answers.rest, 1), body.label)

    return probe


@pytest.mark.parametrize("model", MODELS)
def test_predictions(sender, alone, model):
    held = Contract(sender, model, canary(model), cache(lambda: rest_mates(alone, model)), Batches(sender.served, model, 3))
    attack(held, bodies.anything(model), prober(model, model), EXAMPLES)


def test_predictions_with_the_response_cache(sender, alone):
    """A form body, JSON nested past Python's limit...: refused for itself alone, whatever the cache does."""
    # The cached and the bypassing batch-mates are no items of the batch: the new text is one.
    held = Contract(sender, CACHED, canary(EMBEDDER, CACHED), cached_mates(alone, EMBEDDER, CACHED),
                    Batches(sender.served, CACHED, 2))
    attack(held, st.one_of(bodies.forms(), bodies.deep_json(), bodies.anything(EMBEDDER)), prober(CACHED, EMBEDDER),
           EXAMPLES)


@st.composite
def generation(draw) -> bodies.Body:
    """A valid generation of 1 to 6 tokens (perhaps with a stop string, streamed or whole), or the
    family's cases and mutations."""
    if draw(st.booleans()):
        return draw(bodies.anything(LM))
    asked = {"prompt": draw(st.sampled_from(PROMPTS)), "max_new_tokens": draw(st.integers(1, 6)), "temperature": 0}
    if draw(st.booleans()):
        asked["stop"] = draw(st.sampled_from(["\n", " ", "e", ".", "the", ["\n\n", " a"]]))
    if draw(st.booleans()):
        asked["stream"] = draw(st.booleans())
    return bodies.Body(f"generation {asked}", json.dumps(asked).encode(), JSON, Expect(ANSWER))


def test_causal_lm_predictions(sender, alone):
    """Every admitted request is answered, at any length: 1, 2, 3 new tokens, a stop string early."""
    held = Contract(sender, LM, canary(LM), cache(lambda: rest_mates(alone, LM, count=2)), RunningPeak(sender.served, LM))
    two = bodies.Body("2 new tokens", json.dumps({"prompt": PROMPTS[0], "max_new_tokens": 2}).encode(), JSON,
                      Expect(ANSWER))
    attack(held, generation(), prober(LM, LM), EXAMPLES, [two])

