"""The protocols' request models (pydantic): OpenAI's bodies refuse unknown fields and name the first
fault a reader meets; KServe's envelopes take fields of their own and keep their messages; pydantic's
ValidationError becomes one of our HandlerErrors in one place."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from handlers.errors import BadInput
from handlers.kserve_envelopes import V2Input, v1_request, v2_input, v2_request
from handlers.openai.bodies import chat_schema, completion_schema, embeddings_schema, validated
from handlers.openai.errors import OpenAIError

pytestmark = pytest.mark.unit

HANDLERS = Path(__file__).resolve().parents[2] / "handlers"


@pytest.mark.parametrize("schema, fields", [
    (completion_schema, {"model", "prompt", "max_tokens", "n", "echo", "user", "top_k"}),
    (chat_schema, {"model", "messages", "max_completion_tokens", "tools", "metadata", "ignore_eos"}),
    (embeddings_schema, {"model", "input", "encoding_format", "dimensions", "user"}),
])
def test_openai_bodies_are_models_that_refuse_unknown_fields(schema, fields):
    described = schema().model_json_schema()
    assert described["additionalProperties"] is False
    assert fields <= set(described["properties"])


@pytest.mark.parametrize("body, param, says", [
    ({"foo": 1, "n": 2}, "foo", "Unrecognized request argument supplied: foo"),
    ({"n": 2, "foo": 1}, "n", "Unsupported value for 'n'"),
    ({"model": 5, "\u00e9\r\n": 1}, "\u00e9\r\n", "Unrecognized request argument supplied: \u00e9\r\n"),
    ({"stream": 1, "model": 5}, "model", "Invalid type for 'model': expected a string, got the number 5"),
    ({"user": True}, "user", "Invalid type for 'user': expected a string, got a boolean"),
    ({"stream": True, "stream_options": {"x": 1}}, "stream_options.x", "supplied: stream_options.x"),
    ({"stream_options": {"x": 1}}, "stream_options", "only allowed when 'stream' is enabled"),
    ({"stream": True, "stream_options": []}, "stream_options", "expected an object, got an array"),
])
def test_an_openai_fault_names_the_field_a_reader_meets_first(body, param, says):
    with pytest.raises(OpenAIError) as caught:
        validated(completion_schema(), {"prompt": "hi", **body})
    assert (caught.value.param, caught.value.status) == (param, 400)
    assert says in caught.value.message


def test_a_body_that_is_no_object_is_named_body():
    with pytest.raises(OpenAIError) as caught:
        validated(embeddings_schema(), ["hi"])
    assert caught.value.message == "Invalid type for 'body': expected a JSON object, got an array"


def test_kserve_envelopes_take_fields_of_their_own_and_check_their_types():
    assert v1_request({"instances": [1], "parameters": {"x": 1}}).instances == [1]
    request = v2_request({"id": "r", "inputs": [{}], "extension": True})
    assert (request.id, request.parameters, request.outputs) == ("r", {}, None)
    assert isinstance(v2_input({"name": "t", "shape": [2, 3], "datatype": "FP32", "data": []}), V2Input)


@pytest.mark.parametrize("make, value, message", [
    (v1_request, {"instances": []}, "instances: a non-empty list of instances, got an empty list"),
    (v1_request, {"instances": {"a": 1}}, "instances: a non-empty list of instances, got dict"),
    (v2_request, {"id": 5, "inputs": []}, "id: a string, got int"),
    (v2_request, {"parameters": None, "inputs": [{}]}, "parameters: a JSON object"),
    (v2_request, {"inputs": "x"}, "inputs: a non-empty list of input tensors, got str"),
    (v2_input, {"name": 5, "datatype": "FP32"}, "inputs[0].shape: missing"),
    (v2_input, {"name": 5, "shape": [1], "datatype": "FP32"}, "inputs[0].name: a string, got int"),
    (v2_input, {"name": "t", "shape": [True], "datatype": "FP32"},
     "inputs[0].shape: a non-empty list of non-negative integers, got [True]"),
    (v2_input, {"name": "t", "shape": [2, -1], "datatype": "FP32"},
     "inputs[0].shape: a non-empty list of non-negative integers, got [2, -1]"),
])
def test_a_kserve_fault_keeps_its_message(make, value, message):
    with pytest.raises(BadInput) as caught:
        make(value)
    assert caught.value.message == message and caught.value.status == 400


def test_a_validation_error_becomes_ours_in_one_place():
    catching = sorted(str(p.relative_to(HANDLERS)) for p in HANDLERS.rglob("*.py")
                      if re.search(r"except .*ValidationError", p.read_text()))
    assert catching == ["schemas.py"]
