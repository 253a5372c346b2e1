"""A body's size in any form it reaches a family, and JSON nesting (handlers/json_body.py).

Properties: parsed JSON measures as its compact serialisation, strings as their UTF-8 text (escapes
are not counted) and numbers to within a few bytes each (orjson and Python write some floats
differently); the early stop never turns an over-limit body
into an under-limit one; nesting of any depth, parsed or as bytes, is a 400 naming it, never a
RecursionError. And every family's limit holds for the parsed form TorchServe hands over.
"""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from build.examples import worker_input
from handlers.errors import BadInput, HandlerError, PayloadTooLarge
from handlers.families.causal_lm import CausalLM, CausalLMSettings
from handlers.families.forecaster import ForecasterSettings, QuantileForecaster
from handlers.families.tensor import TensorSettings, decode_tensor
from handlers.families.text_embedder import TextSettings, text_from_body
from handlers.json_body import MAX_DEPTH, body_size, check_size, read_json
from tests.unit.conftest import fuzz_examples

from .test_fuzz_inputs import FUZZ

pytestmark = pytest.mark.unit

QUICK = settings(FUZZ, max_examples=fuzz_examples(100))

JSON = "application/json"
FINITE = st.floats(allow_nan=False, allow_infinity=False)
# Characters JSON writes as they are (no escape): what the measure counts strings by.
PLAIN = st.text(st.characters(exclude_characters='"\\', exclude_categories=("Cc", "Cs")))
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | FINITE | PLAIN,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(PLAIN, inner, max_size=4),
    max_leaves=40,
)


def compact(value) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))


def numbers_in(value) -> int:
    if isinstance(value, list):
        return sum(map(numbers_in, value))
    if isinstance(value, dict):
        return sum(map(numbers_in, value.values()))
    return isinstance(value, float)


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@QUICK
@given(value=st.lists(VALUES, max_size=4) | st.dictionaries(PLAIN, VALUES, max_size=4))
def test_parsed_json_measures_as_its_compact_serialisation(value):
    # orjson writes 1e-05 as 1e-5 and 1e+16 as 1e16: a few bytes per float apart from Python.
    assert abs(body_size(value) - compact(value)) <= 3 * numbers_in(value)


@QUICK
@given(value=VALUES, limit=st.integers(0, 400))
def test_the_early_stop_keeps_the_verdict(value, limit):
    whole = body_size(value)
    assert (body_size(value, limit) > limit) == (whole > limit)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 100_000])
def test_nesting_of_any_depth_is_a_400_naming_it(depth):
    with pytest.raises(BadInput, match="nested deeper than 64"):
        body_size({"a": nested(depth)})
    raw = b"[" * depth + b"]" * depth
    with pytest.raises(BadInput, match="nested deeper than 64"):
        read_json(raw, JSON, 10**9, "send JSON")
    assert body_size(nested(MAX_DEPTH)) == 2 * MAX_DEPTH  # at the limit: measured


def test_the_form_does_not_change_the_limit():
    """17 MiB of valid JSON: 413 whether it arrives as bytes or parsed by TorchServe."""
    value = {"inputs": [0.5] * 4, "pad": "x" * (17 * 1024 * 1024)}
    raw = json.dumps(value).encode()
    for body in (raw, worker_input(raw, JSON)):
        with pytest.raises(PayloadTooLarge, match="over the limit of 16777216"):
            check_size(body, 16 * 1024 * 1024)


# Each family's own limit, for the parsed body TorchServe hands over (was: only bytes were measured).
SEVENTEEN_MIB = [0.123456] * (17 * 1024 * 1024 // len("0.123456,") + 1)


@pytest.mark.parametrize("name, decode, body", [
    ("tensor", lambda b: decode_tensor(b, JSON, TensorSettings(shape=(2,), max_elements=10**7)),
     {"inputs": SEVENTEEN_MIB}),
    ("forecaster", lambda b: QuantileForecaster(ForecasterSettings(window=2, horizon=1, quantiles=(0.5,),
                                                                   max_history=10**7), None).decode(b, JSON),
     {"history": SEVENTEEN_MIB}),
    ("text", lambda b: text_from_body(b, JSON, TextSettings()), {"text": "short", "meta": ["x" * 1024] * 1100}),
])
def test_each_familys_limit_holds_for_parsed_json(name, decode, body):
    with pytest.raises(PayloadTooLarge, match="over the limit"):
        decode(body)


@pytest.mark.parametrize("name, decode", [
    ("tensor", lambda b: decode_tensor(b, JSON, TensorSettings(shape=(1,)))),
    ("forecaster", lambda b: QuantileForecaster(ForecasterSettings(window=2, horizon=1, quantiles=(0.5,)),
                                                None).decode(b, JSON)),
    ("text", lambda b: text_from_body(b, JSON, TextSettings())),
])
@pytest.mark.parametrize("depth", [100, 900])
def test_each_family_names_deep_nesting(name, decode, depth):
    """900 levels is what TorchServe's own parse still hands over parsed; 100k arrives as bytes."""
    for body in ({"inputs": nested(depth), "history": nested(depth), "text": nested(depth)},
                 b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
        with pytest.raises(HandlerError) as refused:
            decode(body)
        assert refused.value.status == 400 and "nested" in refused.value.message, refused.value.message


def test_a_causal_lm_body_is_held_to_its_limit_in_any_form(tiny_dirs):
    """/predictions on a causal LM: was 400 'unknown field "pad"' for the parsed body (the 64 KiB limit
    only looked at bytes), and a prompt nested deep named as a wrong type."""
    family = CausalLM(CausalLMSettings(), tiny_dirs["tiny_lm"])
    raw = json.dumps({"prompt": "The for statement", "pad": "x" * 70_000}).encode()
    for body in (raw, worker_input(raw, JSON)):
        with pytest.raises(PayloadTooLarge, match="over the limit of 65536"):
            family.decode(body, JSON)
    with pytest.raises(BadInput, match="nested deeper than 64"):
        family.decode({"prompt": nested(900)}, JSON)
    assert family.decode({"prompt": "The for statement", "max_new_tokens": 2}, JSON).max_new_tokens == 2
