"""Hostile requests over TorchServe's gRPC inference API (serving/grpc_client.py), every
request/response model: Predictions with the REST strategies' bodies, and StreamPredictions, which a
model that answers in one piece must answer (one message) or refuse, never losing its worker or
its REST batch-mates. gRPC carries no content type: a body keeps its expected outcome only where
its family reads a type-less body the way the REST request had it (JSON)."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest
from hypothesis import strategies as st

from handlers.families import family_class
from tests.e2e.conftest import MODELS
from tests.e2e.hostile import answers, bodies
from tests.e2e.hostile.bodies import JSON, Body
from tests.e2e.hostile.contract import ANSWER, EITHER, GRPC, Batches, Contract, Expect, Probe, Request, attack
from tests.e2e.hostile.mates import canary, grpc_mates, instances, references

pytestmark = [pytest.mark.e2e, pytest.mark.only_on("torchserve")]

EXAMPLES = 8


def typeless(model: str, body: Body) -> Body:
    """The body as gRPC sends it; its expectation where the family reads it alike without a type."""
    reads_json = family_class(bodies.family_of(model)).request_content_type == JSON
    alike = reads_json and (body.content_type is None or body.content_type.startswith(JSON))
    return body if alike else replace(body, expect=Expect(EITHER))


@st.composite
def examples(draw, model: str) -> Body:
    """One of the model's examples in its type-less form (a 200 must be its answer)."""
    every = instances(model)
    index = draw(st.integers(0, len(every) - 1))
    return Body(f"example {index}", every[index].raw, None, Expect(ANSWER), (index,))


def prober(alone, model: str, method: str):
    """Body -> Probe over gRPC `method`: a 200 is one well-formed answer, its example's where it is one."""
    def probe(body: Body) -> Probe:
        if body.instances:
            refs = references(alone, model, [instances(model)[i] for i in body.instances])
            judge = answers.same_as(model, answers.rest, refs)
        else:
            judge = answers.well_formed(model, answers.rest, 1)
        return Probe(Request(f"{GRPC}{method}/{model}", body.data), body.expect, judge, body.label)

    return probe


def contract(sender, alone, model: str) -> Contract:
    return Contract(sender, model, canary(model), cache(lambda: grpc_mates(alone, model)), Batches(sender.served, model, 3))


@pytest.mark.parametrize("model", MODELS)
def test_grpc_predictions(sender, alone, model):
    strategy = st.one_of(examples(model), bodies.anything(model).map(lambda b: typeless(model, b)))
    attack(contract(sender, alone, model), strategy, prober(alone, model, "Predictions"), EXAMPLES)


@pytest.mark.parametrize("model", MODELS)
def test_grpc_stream_predictions_on_a_model_that_answers_in_one_piece(sender, alone, model):
    """Answered in one message (the Predictions answer) or refused: either way the worker lives."""
    strategy = st.one_of(examples(model), bodies.anything(model)).map(lambda b: replace(b, expect=Expect(EITHER)))
    attack(contract(sender, alone, model), strategy, prober(alone, model, "StreamPredictions"), EXAMPLES // 2)
