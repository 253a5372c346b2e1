"""Sampling never fails on finite logits, whatever the request's valid parameters: a fault here
would end every sequence of the batch (the engine's step fails as a whole)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.generation.params import MAX_TEMPERATURE, GenerationRequest
from handlers.generation.sampling import sample_one
from tests.unit.conftest import fuzz_examples

pytestmark = pytest.mark.unit


@settings(derandomize=True, database=None, deadline=None, max_examples=fuzz_examples(200))
@given(temperature=st.floats(min_value=5e-324, max_value=MAX_TEMPERATURE),
       top_k=st.integers(0, 1_000_000), top_p=st.floats(min_value=5e-324, max_value=1.0),
       scale=st.floats(min_value=0.0, max_value=1e30), seed=st.integers(0, 2**63 - 1))
def test_any_valid_request_samples_a_token_from_finite_logits(temperature, top_k, top_p, scale, seed):
    logits = torch.randn(50, generator=torch.Generator().manual_seed(seed % 1000)) * scale
    request = GenerationRequest(prompt="a", prompt_ids=(1,), max_new_tokens=1, temperature=temperature,
                                top_k=top_k, top_p=top_p, seed=seed)
    token = sample_one(logits, request, torch.Generator().manual_seed(seed))
    assert 0 <= token < 50


def test_a_vanishing_temperature_is_greedy():
    logits = torch.tensor([0.5, 3.0, -1.0, 2.9])
    request = GenerationRequest(prompt="a", prompt_ids=(1,), max_new_tokens=1, temperature=1e-300)
    assert sample_one(logits, request, torch.Generator().manual_seed(0)) == 1
