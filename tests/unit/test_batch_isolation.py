"""A request's outcome depends on that request alone: a batch the model fails on is computed again
request by request (only the request that fails alone gets its 500), and an answer the model made
non-finite is that request's 500, never a 200 with nulls."""

import json

import numpy as np
import pytest
import torch

from tests.inprocess import make_handler

pytestmark = pytest.mark.unit


def scan(value: float) -> bytes:
    return json.dumps({"inputs": np.full((1, 4, 4), value).tolist()}).encode()


def send(handler, context, bodies):
    context.headers = {i: {"Content-Type": "application/json"} for i in range(len(bodies))}
    context.statuses.clear()
    return handler.handle([{"body": b} for b in bodies], context)


@pytest.fixture
def tensor(tiny_dirs):
    return make_handler(tiny_dirs["tiny_tensor"], "tiny_tensor", batch_size=8)


def test_a_request_the_model_fails_on_costs_its_batch_mates_nothing(tensor):
    handler, context = tensor
    infer, calls = handler.infer, []

    def fragile(inputs):  # the model fails on any batch holding the poison value
        calls.append(int(inputs.shape[0]))
        if bool((inputs == 7).any()):
            raise RuntimeError("a fault of the model with one input")
        return infer(inputs)

    handler.infer = fragile
    alone = send(handler, context, [scan(1)])[0]
    calls.clear()
    answers = send(handler, context, [scan(1), scan(7), scan(2)])
    assert {idx: status for idx, (status, _) in context.statuses.items()} == {1: 500}
    assert answers[0] == alone and "code" not in json.loads(answers[2])
    assert calls == [3, 1, 1, 1]  # the batch, then each request on its own


def test_a_non_finite_answer_is_that_requests_500(tensor):
    handler, context = tensor
    infer = handler.infer

    def overflowing(inputs):
        out = infer(inputs)
        return torch.where((inputs.flatten(1)[:, :1] == 5), torch.full_like(out, float("inf")), out)

    handler.infer = overflowing
    answers = send(handler, context, [scan(1), scan(5)])
    assert {idx: status for idx, (status, _) in context.statuses.items()} == {1: 500}
    assert "NaN or infinity" in json.loads(answers[1])["message"] and "code" not in json.loads(answers[0])
