"""Hostile KServe v1 (`/v1/models/<m>:predict`) and Open Inference Protocol v2 (`/v2/models/<m>/infer`)
requests, every model: odd instances, datatypes, shapes, ids, parameters, outputs, counts; and v2's
binary-tensor extension, which must be served with the answers /predictions gives or refused by name."""

from __future__ import annotations

from functools import cache

import pytest

from tests.e2e.conftest import MODELS
from tests.e2e.helpers import settings_of
from tests.e2e.hostile import answers, kserve_bodies
from tests.e2e.hostile.bodies import Body
from tests.e2e.hostile.contract import Batches, Contract, Probe, Request, attack
from tests.e2e.hostile.mates import canary, instances, kserve_mates, references

pytestmark = pytest.mark.e2e

EXAMPLES = 6
TENSOR_MODELS = [m for m in MODELS if settings_of(m).family == "tensor"]


def prober(alone, model: str, path: str, parse_for):
    """Body -> Probe: a 200 must be well formed, and hold the answers of the examples it carries."""
    every = instances(model)

    def probe(body: Body) -> Probe:
        if body.instances:
            refs = references(alone, model, [every[i] for i in body.instances])
            judge = answers.same_as(model, parse_for(refs[0]), refs)
        else:
            judge = answers.well_formed(model, parse_for(references(alone, model, every[:1])[0]))
        return Probe(Request(path, body.data, body.content_type, body.headers), body.expect, judge, body.label)

    return probe


def contract(sender, alone, model: str, protocol: str) -> Contract:
    return Contract(sender, model, canary(model), cache(lambda: kserve_mates(alone, model, protocol)),
                    Batches(sender.served, model, 3))


@pytest.mark.parametrize("model", MODELS)
def test_kserve_v1(sender, alone, model):
    attack(contract(sender, alone, model, "v1"), kserve_bodies.v1(model),
           prober(alone, model, f"/v1/models/{model}:predict", lambda _: answers.v1), EXAMPLES)


@pytest.mark.parametrize("model", MODELS)
def test_open_inference_v2(sender, alone, model):
    attack(contract(sender, alone, model, "v2"), kserve_bodies.v2(model),
           prober(alone, model, f"/v2/models/{model}/infer", answers.v2), EXAMPLES)


@pytest.mark.parametrize("model", MODELS)
def test_open_inference_v2_binary_extension(sender, alone, model):
    shape = tuple(settings_of(model).family_settings.shape) if model in TENSOR_MODELS else None
    attack(contract(sender, alone, model, "v2"), kserve_bodies.v2_binary(model, shape),
           prober(alone, model, f"/v2/models/{model}/infer", answers.v2), EXAMPLES // 2)
