"""The OpenAI protocol layer (handlers/openai/) as pure functions: request bodies -> checked calls,
every field honoured, accepted or refused in OpenAI's error shape naming it; routes; models.
No server, no model: a byte-per-token fake tokenizer. Answers and streams: test_openai_answers.py;
chat templates against transformers: test_openai_chat_template.py; routes and models:
test_openai_routes.py."""

from __future__ import annotations

import json

import pytest

from handlers.errors import (
    BadInput,
    ConfigError,
    HandlerError,
    PayloadTooLarge,
    ServerFault,
    UnsupportedMediaType,
)
from handlers.generation.params import Limits, parse_request
from handlers.openai.completions import Call, parse_chat, parse_completion
from handlers.openai.errors import OpenAIError, error_body
from tests.unit import openai_shapes as shapes

pytestmark = pytest.mark.unit

LIMITS = Limits(max_prompt_tokens=40, max_new_tokens=32, default_max_new_tokens=8, max_prompt_chars=60)
ROOMY = Limits(max_prompt_tokens=400, max_new_tokens=32, default_max_new_tokens=8, max_prompt_chars=1000)
MODEL = "tinylm"


def encode(text):
    return list(text.encode())


def completion(body, **kw) -> Call:
    return parse_completion(body, encode, LIMITS, MODEL, **kw)


def chat(body, template=None, limits=LIMITS, **kw) -> Call:
    return parse_chat(body, encode, limits, MODEL, template, **kw)


def refused(parse, body) -> HandlerError:
    """The error `parse` raises for `body`, checked to be in OpenAI's shape."""
    with pytest.raises(HandlerError) as caught:
        parse(body)
    shapes.validate(shapes.ErrorBody, error_body(caught.value))
    return caught.value


def body_of(err: HandlerError) -> dict:
    return json.loads(error_body(err))["error"]


USER = [{"role": "user", "content": "hi"}]


# ---- v1/completions: what is honoured ---------------------------------------------------------
def test_a_minimal_completion_gets_openai_defaults():
    call = completion({"model": MODEL, "prompt": "hello"})
    r = call.request
    assert (r.prompt, r.prompt_ids) == ("hello", tuple(b"hello"))
    assert r.max_new_tokens == LIMITS.default_max_new_tokens
    assert (r.temperature, r.top_p, r.top_k, r.seed, r.stop, r.stream, r.ignore_eos) == (1.0, 1.0, 0, None, (), False,
                                                                                          False)
    assert not r.greedy  # OpenAI samples by default: temperature 0 asks for greedy
    assert not call.chat and call.model == MODEL and not call.stream and not call.include_usage
    assert call.id.startswith("cmpl-") and len(call.id) > 10 and isinstance(call.created, int)


def test_every_honoured_completion_field_reaches_the_generation_request():
    call = completion({"model": MODEL, "prompt": "hello", "max_tokens": 5, "temperature": 0, "top_p": 0.5,
                       "seed": 7, "stop": ["\n", "."], "stream": True, "stream_options": {"include_usage": True},
                       "top_k": 3, "ignore_eos": True}, request_id="abc", created=1700000000)
    r = call.request
    assert (r.max_new_tokens, r.temperature, r.top_p, r.seed, r.stop, r.stream, r.top_k, r.ignore_eos) == (
        5, 0.0, 0.5, 7, ("\n", "."), True, 3, True)
    assert r.greedy and call.stream and call.include_usage
    assert (call.id, call.created) == ("cmpl-abc", 1700000000)


def test_the_generation_request_is_what_predictions_builds_from_the_same_values():
    call = completion({"prompt": "hello", "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "seed": 1,
                       "stop": "x", "top_k": 4})
    native = parse_request({"prompt": "hello", "max_new_tokens": 5, "temperature": 0.7, "top_p": 0.9, "seed": 1,
                            "stop": "x", "top_k": 4}, encode, LIMITS)
    assert call.request == native


def test_a_stop_string_and_a_prompt_list_of_one_string():
    call = completion({"prompt": ["hello"], "stop": "\n"})
    assert call.request.prompt == "hello" and call.request.stop == ("\n",)


def test_null_fields_take_openai_defaults():
    call = completion({"model": None, "prompt": "hi", "max_tokens": None, "temperature": None, "top_p": None,
                       "seed": None, "stop": None, "stream": None, "stream_options": None, "top_k": None,
                       "ignore_eos": None, "n": None, "best_of": None, "echo": None, "logprobs": None,
                       "suffix": None, "user": None, "logit_bias": None, "presence_penalty": None,
                       "frequency_penalty": None})
    r = call.request
    assert (r.max_new_tokens, r.temperature, r.top_p, r.seed, r.stop, r.stream) == (8, 1.0, 1.0, None, (), False)
    assert call.model == MODEL


def test_top_k_minus_one_is_vllms_off():
    assert completion({"prompt": "hi", "top_k": -1}).request.top_k == 0


def test_the_model_may_be_its_served_name_or_an_alias_and_is_echoed():
    assert completion({"prompt": "hi"}).model == MODEL
    assert completion({"model": "tinylm.mar", "prompt": "hi"}, aliases=("tinylm.mar",)).model == "tinylm.mar"


def test_another_model_is_404_model_not_found():
    err = refused(completion, {"model": "gpt-4o", "prompt": "hi"})
    assert err.status == 404
    assert body_of(err) == {"message": "The model `gpt-4o` does not exist or is not served at this address.",
                            "type": "invalid_request_error", "param": "model", "code": "model_not_found"}


def test_ids_are_unique_per_call():
    assert completion({"prompt": "hi"}).id != completion({"prompt": "hi"}).id


@pytest.mark.parametrize("field, value", [
    ("n", 1), ("best_of", 1), ("echo", False), ("frequency_penalty", 0), ("frequency_penalty", 0.0),
    ("presence_penalty", 0), ("logit_bias", {}), ("suffix", ""), ("user", "end-user-7"),
])
def test_completion_fields_at_their_default_are_accepted(field, value):
    assert completion({"prompt": "hi", field: value}).request.prompt == "hi"


# ---- v1/completions: what is refused, in OpenAI's shape, naming the field -----------------------
@pytest.mark.parametrize("body, param, code", [
    ({"n": 2}, "n", "unsupported_value"),
    ({"n": True}, "n", "unsupported_value"),  # true is not 1
    ({"best_of": 3}, "best_of", "unsupported_value"),
    ({"echo": True}, "echo", "unsupported_value"),
    ({"frequency_penalty": 0.5}, "frequency_penalty", "unsupported_value"),
    ({"presence_penalty": -1}, "presence_penalty", "unsupported_value"),
    ({"logit_bias": {"50256": -100}}, "logit_bias", "unsupported_value"),
    ({"logprobs": 0}, "logprobs", "unsupported_value"),
    ({"logprobs": 5}, "logprobs", "unsupported_value"),
    ({"suffix": "}"}, "suffix", "unsupported_value"),
    ({"user": 5}, "user", "invalid_type"),
    ({"user": True}, "user", "invalid_type"),
    ({"tools": []}, "tools", None),  # a chat field: unknown here
    ({"max_new_tokens": 5}, "max_new_tokens", None),  # /predictions' name, not OpenAI's
    ({"foo": 1}, "foo", None),
    ({"model": 5}, "model", "invalid_type"),
    ({"stream": "yes"}, "stream", "invalid_type"),
    ({"stream_options": {"include_usage": True}}, "stream_options", None),  # without stream
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage", "invalid_type"),
    ({"stream": True, "stream_options": {"continuous_usage_stats": "yes"}}, "stream_options.continuous_usage_stats",
     "invalid_type"),
    ({"stream": True, "stream_options": {"usage_every_n": 2}}, "stream_options.usage_every_n", None),
    ({"stream": True, "stream_options": True}, "stream_options", "invalid_type"),
    ({"max_tokens": 0}, "max_tokens", None),
    ({"max_tokens": 33}, "max_tokens", None),  # over the archive's max_new_tokens
    ({"max_tokens": "5"}, "max_tokens", None),
    ({"temperature": -0.1}, "temperature", None),
    ({"temperature": "hot"}, "temperature", None),
    ({"top_p": 0}, "top_p", None),
    ({"top_p": 1.5}, "top_p", None),
    ({"seed": -1}, "seed", None),
    ({"seed": 1.5}, "seed", None),
    ({"stop": [""]}, "stop", None),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", None),
    ({"stop": 5}, "stop", None),
    ({"top_k": -2}, "top_k", None),
    ({"ignore_eos": "yes"}, "ignore_eos", None),
])
def test_unsupported_and_invalid_completion_fields_are_400s_naming_the_param(body, param, code):
    err = refused(completion, {"model": MODEL, "prompt": "hi", **body})
    assert err.status == 400
    error = body_of(err)
    assert (error["param"], error["type"], error["code"]) == (param, "invalid_request_error", code)
    assert param.split(".")[-1] in error["message"]


@pytest.mark.parametrize("prompt, says", [
    ([1, 2, 3], "token-id prompts"),
    ([[1, 2], [3]], "token-id prompts"),
    (["a", "b"], "one prompt per request"),
    ([], "array of one string"),
    (5, "array of one string"),
    ({"text": "hi"}, "array of one string"),
    ("", "non-empty"),
])
def test_prompts_other_than_one_text_are_refused_naming_prompt(prompt, says):
    err = refused(completion, {"prompt": prompt})
    assert err.status == 400 and body_of(err)["param"] == "prompt" and says in err.message


def test_a_missing_prompt_is_named():
    err = refused(completion, {"model": MODEL})
    assert body_of(err)["param"] == "prompt" and "Missing required parameter" in err.message


@pytest.mark.parametrize("body", [["hi"], "hi", None, 5])
def test_a_body_that_is_not_an_object_is_a_400(body):
    assert refused(completion, body).status == 400


@pytest.mark.parametrize("prompt, over", [("x" * 41, "tokens"), ("x" * 61, "characters")])
def test_a_prompt_over_the_archives_limits_is_context_length_exceeded(prompt, over):
    err = refused(completion, {"prompt": prompt})
    assert err.status == 400 and over in err.message  # OpenAI answers 400, where /predictions answers 413
    assert (body_of(err)["param"], body_of(err)["code"]) == ("prompt", "context_length_exceeded")


# ---- v1/chat/completions -------------------------------------------------------------------------
def test_a_minimal_chat_renders_the_plain_template_and_gets_openai_defaults():
    call = chat({"model": MODEL, "messages": [{"role": "system", "content": "Be terse."},
                                              {"role": "user", "content": "hi"}]})
    assert call.request.prompt == "system: Be terse.\nuser: hi\nassistant:"
    assert call.request.prompt_ids == tuple(call.request.prompt.encode())
    assert (call.request.temperature, call.request.top_p, call.request.max_new_tokens) == (1.0, 1.0, 8)
    assert call.chat and call.id.startswith("chatcmpl-") and call.model == MODEL


def test_the_chat_template_renders_the_messages_with_the_special_tokens():
    template = ("{{ bos_token }}{% for m in messages %}<{{ m.role }}{% if m.name %} {{ m.name }}{% endif %}>"
                "{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    call = chat({"messages": [{"role": "developer", "content": "Be terse."},
                              {"role": "user", "content": [{"type": "text", "text": "one"},
                                                           {"type": "text", "text": "two"}], "name": "ann"},
                              {"role": "assistant", "content": "ok", "refusal": None, "tool_calls": []},
                              {"role": "user", "content": "go"}]}, template, bos_token="<s>", eos_token="</s>",
                limits=ROOMY)
    assert call.request.prompt == ("<s><system>Be terse.</s><user ann>one\ntwo</s><assistant>ok</s><user>go</s>"
                                   "<assistant>")


def test_every_honoured_chat_field_reaches_the_generation_request():
    call = chat({"messages": USER, "max_completion_tokens": 6, "temperature": 0, "top_p": 0.25, "seed": 3,
                 "stop": ["\n"], "stream": True, "stream_options": {"include_usage": True,
                                                                     "include_obfuscation": False},
                 "top_k": 2, "ignore_eos": True}, request_id="r1", created=5)
    r = call.request
    assert (r.max_new_tokens, r.temperature, r.top_p, r.seed, r.stop, r.stream, r.top_k, r.ignore_eos) == (
        6, 0.0, 0.25, 3, ("\n",), True, 2, True)
    assert call.include_usage and (call.id, call.created) == ("chatcmpl-r1", 5)


@pytest.mark.parametrize("body, expected", [
    ({"max_tokens": 4}, 4),
    ({"max_completion_tokens": 5}, 5),
    ({"max_tokens": 5, "max_completion_tokens": 5}, 5),
    ({"max_tokens": None, "max_completion_tokens": 7}, 7),
    ({}, 8),
])
def test_chat_max_tokens_or_max_completion_tokens(body, expected):
    assert chat({"messages": USER, **body}).request.max_new_tokens == expected


@pytest.mark.parametrize("field, value", [
    ("n", 1), ("logprobs", False), ("top_logprobs", 0), ("tools", []), ("tool_choice", "none"), ("functions", []),
    ("function_call", "none"), ("response_format", {"type": "text"}), ("modalities", ["text"]), ("store", False),
    ("service_tier", "auto"), ("service_tier", "default"), ("parallel_tool_calls", True), ("metadata", {"k": "v"}),
    ("user", "u"), ("safety_identifier", "s"), ("prompt_cache_key", "p"), ("presence_penalty", 0.0),
    ("frequency_penalty", 0), ("logit_bias", {}), ("audio", None), ("reasoning_effort", None),
])
def test_chat_fields_at_their_default_are_accepted(field, value):
    assert chat({"messages": USER, field: value}).request.prompt == "user: hi\nassistant:"


TOOL = {"type": "function", "function": {"name": "f", "parameters": {}}}


@pytest.mark.parametrize("body, param, code", [
    ({"n": 2}, "n", "unsupported_value"),
    ({"logprobs": True}, "logprobs", "unsupported_value"),
    ({"top_logprobs": 2}, "top_logprobs", "unsupported_value"),
    ({"tools": [TOOL]}, "tools", "unsupported_value"),
    ({"tool_choice": "auto"}, "tool_choice", "unsupported_value"),
    ({"functions": [TOOL["function"]]}, "functions", "unsupported_value"),
    ({"function_call": "auto"}, "function_call", "unsupported_value"),
    ({"response_format": {"type": "json_object"}}, "response_format", "unsupported_value"),
    ({"modalities": ["text", "audio"]}, "modalities", "unsupported_value"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "unsupported_value"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction", "unsupported_value"),
    ({"reasoning_effort": "low"}, "reasoning_effort", "unsupported_value"),
    ({"verbosity": "low"}, "verbosity", "unsupported_value"),
    ({"web_search_options": {}}, "web_search_options", "unsupported_value"),
    ({"store": True}, "store", "unsupported_value"),
    ({"service_tier": "flex"}, "service_tier", "unsupported_value"),
    ({"presence_penalty": 0.1}, "presence_penalty", "unsupported_value"),
    ({"metadata": "x"}, "metadata", "invalid_type"),
    ({"parallel_tool_calls": "x"}, "parallel_tool_calls", "invalid_type"),
    ({"echo": False}, "echo", None),  # a completions field: unknown here
    ({"prompt": "hi"}, "prompt", None),
    ({"max_tokens": 4, "max_completion_tokens": 5}, "max_tokens", None),
    ({"max_completion_tokens": 33}, "max_completion_tokens", None),
    ({"max_tokens": 0}, "max_tokens", None),
    ({"temperature": 11}, "temperature", None),
    ({"stop": [""]}, "stop", None),
    ({"stream_options": {"include_usage": True}}, "stream_options", None),
])
def test_unsupported_and_invalid_chat_fields_are_400s_naming_the_param(body, param, code):
    err = refused(chat, {"messages": USER, **body})
    assert err.status == 400
    assert (body_of(err)["param"], body_of(err)["code"]) == (param, code)


@pytest.mark.parametrize("messages, param, code", [
    (None, "messages", None),
    ([], "messages", "invalid_type"),
    ("hi", "messages", "invalid_type"),
    (["hi"], "messages[0]", "invalid_type"),
    ([{"content": "hi"}], "messages[0].role", None),
    ([{"role": "robot", "content": "hi"}], "messages[0].role", None),
    ([{"role": "tool", "content": "42", "tool_call_id": "c1"}], "messages[0].role", "unsupported_value"),
    ([{"role": "function", "content": "42", "name": "f"}], "messages[0].role", "unsupported_value"),
    ([{"role": "user"}], "messages[0].content", "invalid_type"),
    ([{"role": "user", "content": None}], "messages[0].content", "invalid_type"),
    ([{"role": "user", "content": 5}], "messages[0].content", "invalid_type"),
    ([{"role": "user", "content": []}], "messages[0].content", "invalid_type"),
    ([{"role": "user", "content": ["hi"]}], "messages[0].content[0]", "invalid_type"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
     "messages[0].content[0].type", "unsupported_value"),
    ([{"role": "user", "content": [{"type": "banana", "text": "x"}]}], "messages[0].content[0].type", None),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages[0].content[0].text", "invalid_type"),
    ([{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]}],
     "messages[0].content[0].cache_control", None),
    ([{"role": "user", "content": "hi", "foo": 1}], "messages[0].foo", None),
    ([{"role": "user", "content": "hi", "name": 5}], "messages[0].name", "invalid_type"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "tool_calls": [{"id": "c"}]}],
     "messages[1].tool_calls", "unsupported_value"),
    ([{"role": "assistant", "content": "x", "refusal": "no"}], "messages[0].refusal", "unsupported_value"),
])
def test_messages_other_than_text_turns_are_400s_naming_the_message(messages, param, code):
    body = {"model": MODEL} if messages is None else {"messages": messages}
    err = refused(chat, body)
    assert err.status == 400
    assert (body_of(err)["param"], body_of(err)["code"]) == (param, code)


def test_a_conversation_over_the_character_limit_is_refused_before_rendering():
    # Rendering this template would fail (an undefined call): a 500, not the 400 expected.
    err = refused(lambda b: parse_chat(b, encode, LIMITS, MODEL, "{{ never() }}"),
                  {"messages": [{"role": "user", "content": "x" * 61}]})
    assert (body_of(err)["param"], body_of(err)["code"]) == ("messages", "context_length_exceeded")


def test_a_rendered_prompt_over_the_token_limit_names_messages():
    err = refused(chat, {"messages": [{"role": "user", "content": "x" * 30}]})  # 30 + the template's 17 > 40
    assert err.status == 400 and "tokens" in err.message
    assert (body_of(err)["param"], body_of(err)["code"]) == ("messages", "context_length_exceeded")


def test_a_template_refusing_the_messages_is_the_requests_400():
    template = ("{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
                "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                "{% endif %}{{ m.content }}{% endfor %}")
    assert chat({"messages": USER}, template).request.prompt == "hi"
    err = refused(lambda b: chat(b, template), {"messages": USER * 2})
    assert err.status == 400 and body_of(err)["param"] == "messages" and "must alternate" in err.message


def test_a_template_failing_otherwise_is_our_500():
    err = refused(lambda b: chat(b, "{{ messages.__class__.__mro__ }}"), {"messages": USER})
    assert isinstance(err, ServerFault) and err.status == 500
    assert body_of(err)["type"] == "server_error"


def test_a_template_that_is_not_jinja_is_a_config_error():
    with pytest.raises(ConfigError, match="chat template"):
        chat({"messages": USER}, "{% for m in messages %}")


# ---- error bodies for any HandlerError -------------------------------------------------------------
@pytest.mark.parametrize("err, status, type_, param, code", [
    (BadInput('"x" is wrong', param="x"), 400, "invalid_request_error", "x", None),
    (BadInput("body is wrong"), 400, "invalid_request_error", None, None),
    (PayloadTooLarge("too big"), 413, "invalid_request_error", None, None),
    (UnsupportedMediaType("not JSON"), 415, "invalid_request_error", None, None),
    (ServerFault("ours"), 500, "server_error", None, None),
    (ConfigError("archive"), 500, "server_error", None, None),
    (OpenAIError("nope", param="n", code="c", status=404, type="not_found_error"), 404, "not_found_error", "n", "c"),
])
def test_any_handler_error_gets_openais_error_shape(err, status, type_, param, code):
    body = shapes.validate(shapes.ErrorBody, error_body(err))
    assert err.status == status
    assert (body.error.message, body.error.type, body.error.param, body.error.code) == (err.message, type_, param,
                                                                                         code)


def test_predictions_errors_now_name_their_field_too():
    with pytest.raises(BadInput) as caught:
        parse_request({"prompt": "hi", "max_new_tokens": 0}, encode, LIMITS)
    assert caught.value.param == "max_new_tokens" and '"max_new_tokens"' in caught.value.message
