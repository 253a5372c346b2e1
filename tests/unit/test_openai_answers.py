"""OpenAI answers from handlers/openai/: whole bodies, streamed chunks decoded the way the `openai`
client decodes them (tests/unit/openai_shapes.py: its types' fields, its SSE decoding), and
v1/embeddings end to end (parse -> answer)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from handlers.errors import BadInput, PayloadTooLarge, ServerFault
from handlers.generation.params import Limits
from handlers.openai import sse
from handlers.openai.completions import parse_chat, parse_completion
from handlers.openai.embeddings import embeddings_response, parse_embeddings
from handlers.openai.errors import OpenAIError, error_body, error_event
from handlers.openai.responses import (
    chat_chunk,
    chat_response,
    chunk,
    completion_chunk,
    completion_response,
    response,
    stream_end,
)
from tests.unit import openai_shapes as shapes

pytestmark = pytest.mark.unit

LIMITS = Limits(max_prompt_tokens=100, max_new_tokens=32, default_max_new_tokens=8, max_prompt_chars=400)
MODEL = "tinylm"
USER = [{"role": "user", "content": "hi"}]


def encode(text):
    return list(text.encode())


def completion_call(**body):
    return parse_completion({"model": MODEL, "prompt": "hello", **body}, encode, LIMITS, MODEL, request_id="r1",
                            created=1700000000)


def chat_call(**body):
    return parse_chat({"model": MODEL, "messages": USER, **body}, encode, LIMITS, MODEL, None, request_id="r2",
                      created=1700000001)


def split_bytes(stream: bytes, size: int):
    """The stream as the client may receive it: in pieces cutting events and lines anywhere."""
    return [stream[i:i + size] for i in range(0, len(stream), size)]


# ---- whole answers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_a_whole_completion_is_openais_completion(finish):
    answer = shapes.validate(shapes.Completion, completion_response(completion_call(), " world", finish, 5, 2))
    assert (answer.id, answer.created, answer.model, answer.object) == ("cmpl-r1", 1700000000, MODEL,
                                                                        "text_completion")
    assert [(c.index, c.text, c.finish_reason) for c in answer.choices] == [(0, " world", finish)]
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (5, 2, 7)


@pytest.mark.parametrize("finish", ["stop", "length"])
def test_a_whole_chat_answer_is_openais_chat_completion(finish):
    answer = shapes.validate(shapes.ChatCompletion, chat_response(chat_call(), "Hello!", finish, 9, 3))
    assert (answer.id, answer.created, answer.model, answer.object) == ("chatcmpl-r2", 1700000001, MODEL,
                                                                        "chat.completion")
    [choice] = answer.choices
    assert (choice.index, choice.message.role, choice.message.content, choice.finish_reason) == (
        0, "assistant", "Hello!", finish)
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (9, 3, 12)


def test_response_answers_for_the_calls_endpoint():
    assert shapes.validate(shapes.ChatCompletion, response(chat_call(), "x", "stop", 1, 1)).choices[0].message
    assert shapes.validate(shapes.Completion, response(completion_call(), "x", "stop", 1, 1)).choices[0].text == "x"


@pytest.mark.parametrize("text", [" héllo 🌍\n\"q\" ", "\u2028<b>&amp;</b>\t", ""])
def test_text_comes_back_exactly(text):
    answer = shapes.validate(shapes.ChatCompletion, chat_response(chat_call(), text, "stop", 1, 4))
    assert answer.choices[0].message.content == text
    assert shapes.validate(shapes.Completion, completion_response(completion_call(), text, "stop", 1, 4)
                           ).choices[0].text == text


@pytest.mark.parametrize("make", [
    lambda: completion_response(completion_call(), "x", "eos", 1, 1),
    lambda: chat_response(chat_call(), "x", None, 1, 1),
    lambda: completion_chunk(completion_call(stream=True), "x", finish="abort"),
    lambda: chat_chunk(chat_call(stream=True), "x", finish="tool"),
])
def test_a_finish_reason_other_than_ours_is_our_fault(make):
    with pytest.raises(ServerFault):
        make()


# ---- streams -------------------------------------------------------------------------------------------
def chat_stream(call, pieces, finish="stop", usage=(9, 3)):
    out = [chat_chunk(call, "", role_first=True)]
    out += [chat_chunk(call, piece) for piece in pieces]
    out.append(chat_chunk(call, "", finish=finish))
    return b"".join(out) + stream_end(call, *usage)


def completion_stream(call, pieces, finish="length", usage=(5, 4)):
    out = [completion_chunk(call, piece) for piece in pieces] + [completion_chunk(call, "", finish=finish)]
    return b"".join(out) + stream_end(call, *usage)


@pytest.mark.parametrize("piece_size", [1, 7, 10_000])
def test_a_streamed_chat_decodes_as_openais_chunks(piece_size):
    call = chat_call(stream=True)
    stream = chat_stream(call, ["Hel", "lo", " 🌍"])
    chunks = shapes.decode_stream(split_bytes(stream, piece_size), shapes.ChatCompletionChunk)
    assert len(chunks) == 5
    assert {(c.id, c.created, c.model, c.object) for c in chunks} == {("chatcmpl-r2", 1700000001, MODEL,
                                                                        "chat.completion.chunk")}
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello 🌍"
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, None, None, "stop"]
    assert all(c.choices[0].index == 0 for c in chunks)
    assert all(c.usage is None for c in chunks)
    assert all("usage" not in json.loads(data) for data in list(shapes.events([stream]))[:-1])
    assert stream.endswith(b"\n\ndata: [DONE]\n\n")


def test_a_streamed_chat_with_include_usage_ends_with_a_usage_chunk():
    call = chat_call(stream=True, stream_options={"include_usage": True})
    stream = chat_stream(call, ["a", "b"], finish="length", usage=(9, 2))
    chunks = shapes.decode_stream([stream], shapes.ChatCompletionChunk)
    *text_chunks, last = chunks
    assert [c.choices[0].finish_reason for c in text_chunks] == [None, None, None, "length"]
    assert all(c.usage is None for c in text_chunks)
    assert all(json.loads(data)["usage"] is None for data in list(shapes.events([stream]))[:-2])  # null, not absent
    assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens,
                                   last.usage.total_tokens) == (9, 2, 11)
    assert last.id == text_chunks[0].id


def test_the_first_chat_chunk_may_carry_text():
    call = chat_call(stream=True)
    [first] = shapes.decode_stream([chat_chunk(call, "Hi", role_first=True), sse.DONE], shapes.ChatCompletionChunk)
    assert (first.choices[0].delta.role, first.choices[0].delta.content) == ("assistant", "Hi")


def test_the_last_chat_chunk_may_carry_text():
    call = chat_call(stream=True)
    [last] = shapes.decode_stream([chat_chunk(call, "end", finish="stop"), sse.DONE], shapes.ChatCompletionChunk)
    assert (last.choices[0].delta.content, last.choices[0].finish_reason) == ("end", "stop")


def test_an_empty_middle_chat_chunk_has_an_empty_delta():
    assert json.loads(next(shapes.events([chat_chunk(chat_call(stream=True), "")])))["choices"][0]["delta"] == {}


@pytest.mark.parametrize("piece_size", [1, 10_000])
def test_a_streamed_completion_decodes_as_openais_completion_chunks(piece_size):
    call = completion_call(stream=True)
    stream = completion_stream(call, [" wor", "ld"])
    chunks = shapes.decode_stream(split_bytes(stream, piece_size), shapes.CompletionChunk)
    assert {(c.id, c.created, c.model, c.object) for c in chunks} == {("cmpl-r1", 1700000000, MODEL,
                                                                        "text_completion")}
    assert "".join(c.choices[0].text for c in chunks) == " world"
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, "length"]
    assert all(c.usage is None for c in chunks)


def test_a_streamed_completion_with_include_usage_ends_with_a_usage_chunk():
    call = completion_call(stream=True, stream_options={"include_usage": True})
    *text_chunks, last = shapes.decode_stream([completion_stream(call, ["x"], usage=(5, 1))], shapes.CompletionChunk)
    assert [c.choices[0].finish_reason for c in text_chunks] == [None, "length"]
    assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens) == (5, 1)


def test_chunk_streams_for_the_calls_endpoint():
    assert b'"chat.completion.chunk"' in chunk(chat_call(stream=True), "x", first=True)
    assert b'"delta":{"role":"assistant"' in chunk(chat_call(stream=True), "x", first=True)
    assert b'"text_completion"' in chunk(completion_call(stream=True), "x")


def test_every_event_is_one_data_line_and_a_blank_line():
    call = chat_call(stream=True, stream_options={"include_usage": True})
    stream = chat_stream(call, ["line one\nline two", "\r\n"])
    events = stream.split(b"\n\n")
    assert events[-1] == b"" and all(e.startswith(b"data: ") and b"\n" not in e and b"\r" not in e
                                     for e in events[:-1])
    chunks = shapes.decode_stream([stream], shapes.ChatCompletionChunk)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "line one\nline two\r\n"


def test_a_failure_mid_stream_is_an_error_event_the_client_raises():
    call = chat_call(stream=True)
    stream = chat_chunk(call, "", role_first=True) + error_event(ServerFault("the engine failed"))
    with pytest.raises(shapes.StreamError) as caught:
        shapes.decode_stream([stream], shapes.ChatCompletionChunk)
    assert caught.value.error == {"message": "the engine failed", "type": "server_error", "param": None,
                                  "code": None}


def test_a_stream_cut_short_is_noticed():
    call = chat_call(stream=True)
    with pytest.raises(AssertionError, match="DONE"):
        shapes.decode_stream([chat_chunk(call, "", role_first=True)], shapes.ChatCompletionChunk)


# ---- v1/embeddings ----------------------------------------------------------------------------------------
VECTORS = [[0.1, -0.25, 3.5], [1e-8, 0.0, -1.0]]


def embed(body, **kw):
    return parse_embeddings({"model": "minilm", **body}, "minilm", **kw)


def test_one_text_and_floats_by_default():
    call = embed({"input": "hello"})
    assert (call.texts, call.encoding_format, call.model) == (("hello",), "float", "minilm")
    answer = shapes.validate(shapes.CreateEmbeddingResponse, embeddings_response(VECTORS[:1], call.model, 2,
                                                                                 call.encoding_format))
    assert [(e.index, e.embedding) for e in answer.data] == [(0, VECTORS[0])]
    assert (answer.model, answer.usage.prompt_tokens, answer.usage.total_tokens) == ("minilm", 2, 2)


def test_a_list_of_texts_in_order_as_base64_floats32_the_client_decodes():
    call = embed({"input": ["a", "b"], "encoding_format": "base64", "user": "u", "dimensions": 3}, dimensions=3)
    assert call.texts == ("a", "b") and call.encoding_format == "base64"
    answer = shapes.validate(shapes.CreateEmbeddingResponse,
                             embeddings_response([np.array(v, dtype=np.float32) for v in VECTORS], call.model, 4,
                                                 call.encoding_format))
    assert [e.index for e in answer.data] == [0, 1]
    decoded = [shapes.decode_embedding(e.embedding) for e in answer.data]
    assert decoded == [np.array(v, dtype=np.float32).tolist() for v in VECTORS]


def test_numpy_vectors_as_floats():
    vectors = np.array(VECTORS, dtype=np.float32)[:, ::-1]  # not contiguous
    answer = shapes.validate(shapes.CreateEmbeddingResponse, embeddings_response(list(vectors), "minilm", 1))
    assert np.allclose([e.embedding for e in answer.data], vectors)


def test_the_familys_check_runs_on_every_text_and_its_error_names_input():
    seen = []

    def check(text):
        seen.append(text)
        if not text.strip():
            raise BadInput("text is empty")
        if len(text) > 5:
            raise PayloadTooLarge("text is too long")
        return text.strip()

    assert embed({"input": [" a ", "b"]}, check=check).texts == ("a", "b") and seen == [" a ", "b"]
    for texts, status, where in ((["a", " "], 400, "input[1]"), ("toolong", 413, "input")):
        with pytest.raises(OpenAIError) as caught:
            embed({"input": texts}, check=check)
        error = shapes.validate(shapes.ErrorBody, error_body(caught.value)).error
        assert caught.value.status == status and error.param == "input" and error.message.startswith(where + ":")


@pytest.mark.parametrize("body, param, code", [
    ({"input": [1, 2, 3]}, "input", "unsupported_value"),
    ({"input": [[1, 2], [3]]}, "input", "unsupported_value"),
    ({"input": []}, "input", "invalid_type"),
    ({"input": 5}, "input", "invalid_type"),
    ({"input": ["a", 5]}, "input", "invalid_type"),
    ({}, "input", None),
    ({"input": ["a"] * 3}, "input", None),  # over max_inputs
    ({"input": "a", "encoding_format": "hex"}, "encoding_format", None),
    ({"input": "a", "dimensions": 2}, "dimensions", "unsupported_value"),
    ({"input": "a", "dimensions": "3"}, "dimensions", "invalid_type"),
    ({"input": "a", "user": 5}, "user", "invalid_type"),
    ({"input": "a", "truncate": True}, "truncate", None),
    ({"input": "a", "model": "text-embedding-3-small"}, "model", "model_not_found"),
])
def test_unsupported_embedding_requests_are_refused_naming_the_param(body, param, code):
    with pytest.raises(OpenAIError) as caught:
        parse_embeddings({"model": "minilm", **body}, "minilm", dimensions=3, max_inputs=2)
    error = shapes.validate(shapes.ErrorBody, error_body(caught.value)).error
    assert (error.param, error.code) == (param, code)
    assert caught.value.status == (404 if code == "model_not_found" else 400)


def test_dimensions_are_refused_when_the_models_size_is_not_known():
    with pytest.raises(OpenAIError, match="cannot be shortened"):
        embed({"input": "a", "dimensions": 384})


def test_continuous_usage_stats_puts_the_counts_so_far_in_every_chunk():
    """What guidellm sends (vLLM's stream_options.continuous_usage_stats): each chunk's usage holds
    the tokens generated so far; without include_usage it asks for nothing."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    call = completion_call(stream=True, stream_options=options)
    assert call.continuous_usage
    pieces = [chunk(call, "a", counts=(5, 1)), chunk(call, "b", counts=(5, 2)),
              chunk(call, "", finish="length", counts=(5, 2)), stream_end(call, 5, 2)]
    *text_chunks, last = shapes.decode_stream(pieces, shapes.CompletionChunk)
    assert [c.usage.completion_tokens for c in text_chunks] == [1, 2, 2]
    assert all(c.usage.prompt_tokens == 5 for c in text_chunks) and last.usage.total_tokens == 7
    quiet = completion_call(stream=True, stream_options={"continuous_usage_stats": True})
    assert not quiet.continuous_usage and b'"usage"' not in chunk(quiet, "a", counts=(5, 1))
