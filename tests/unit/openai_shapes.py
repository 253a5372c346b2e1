"""OpenAI's answer types and its Python client's stream decoding, for tests that may not import `openai`.

The models copy the fields of openai-python's own types (src/openai/types: completion.py,
completion_choice.py, completion_usage.py, chat/chat_completion*.py, create_embedding_response.py,
embedding.py, model.py), stricter than the client: every field we send must be one of theirs
(extra="forbid") and of its exact type (strict). `decode_stream` follows openai/_streaming.py:
lines split on CR, LF or CRLF, events on blank lines, `data: [DONE]` ends the stream, and an event
whose JSON has "error" raises, as the client's APIError.

When `openai` is importable, `validate` also checks each body with the client's own types.
"""

from __future__ import annotations

import array
import base64
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CompletionUsage(_Strict):
    completion_tokens: int
    prompt_tokens: int
    total_tokens: int


class CompletionChoice(_Strict):
    finish_reason: Literal["stop", "length", "content_filter"]
    index: int
    logprobs: None = None
    text: str


class StreamedCompletionChoice(CompletionChoice):
    # The client's Completion type says finish_reason is never null, but OpenAI streams null until the
    # last chunk and the client builds chunks without validating them.
    finish_reason: Optional[Literal["stop", "length", "content_filter"]]


class Completion(_Strict):
    id: str
    choices: list[CompletionChoice]
    created: int
    model: str
    object: Literal["text_completion"]
    system_fingerprint: Optional[str] = None
    usage: Optional[CompletionUsage] = None


class CompletionChunk(Completion):
    choices: list[StreamedCompletionChoice]


class ChatCompletionMessage(_Strict):
    content: Optional[str] = None
    refusal: Optional[str] = None
    role: Literal["assistant"]


class ChatChoice(_Strict):
    finish_reason: FinishReason
    index: int
    logprobs: None = None
    message: ChatCompletionMessage


class ChatCompletion(_Strict):
    id: str
    choices: list[ChatChoice]
    created: int
    model: str
    object: Literal["chat.completion"]
    system_fingerprint: Optional[str] = None
    usage: Optional[CompletionUsage] = None


class ChoiceDelta(_Strict):
    content: Optional[str] = None
    refusal: Optional[str] = None
    role: Optional[Literal["developer", "system", "user", "assistant", "tool"]] = None


class ChunkChoice(_Strict):
    delta: ChoiceDelta
    finish_reason: Optional[FinishReason] = None
    index: int
    logprobs: None = None


class ChatCompletionChunk(_Strict):
    id: str
    choices: list[ChunkChoice]
    created: int
    model: str
    object: Literal["chat.completion.chunk"]
    system_fingerprint: Optional[str] = None
    usage: Optional[CompletionUsage] = None


class Embedding(_Strict):
    embedding: Union[list[float], str]  # str: base64, decoded by the client (decode_embeddings)
    index: int
    object: Literal["embedding"]


class EmbeddingUsage(_Strict):
    prompt_tokens: int
    total_tokens: int


class CreateEmbeddingResponse(_Strict):
    data: list[Embedding]
    model: str
    object: Literal["list"]
    usage: EmbeddingUsage


class Model(_Strict):
    id: str
    created: int
    object: Literal["model"]
    owned_by: str


class ModelList(_Strict):  # the client's SyncPage[Model]
    object: Literal["list"]
    data: list[Model]


class ErrorObject(_Strict):
    message: str
    type: str
    param: Optional[str]
    code: Optional[str]


class ErrorBody(_Strict):
    error: ErrorObject


_CLIENT_TYPES = {
    Completion: "openai.types:Completion",
    CompletionChunk: "openai.types:Completion",
    ChatCompletion: "openai.types.chat:ChatCompletion",
    ChatCompletionChunk: "openai.types.chat:ChatCompletionChunk",
    CreateEmbeddingResponse: "openai.types:CreateEmbeddingResponse",
    Model: "openai.types:Model",
}


def _client_type(shape) -> Optional[type]:
    where = _CLIENT_TYPES.get(shape)
    if where is None:
        return None
    module, name = where.split(":")
    try:
        return getattr(__import__(module, fromlist=[name]), name)
    except ImportError:  # openai not installed: our copies only
        return None


def validate(shape, body: Union[bytes, dict]):
    """`body` (JSON bytes or decoded) as `shape`; with `openai` installed, as the client's type too."""
    data = json.loads(body) if isinstance(body, (bytes, str)) else body
    parsed = shape.model_validate(data)
    client = _client_type(shape)
    if client is not None and shape is not CompletionChunk:  # see StreamedCompletionChoice
        if shape is CreateEmbeddingResponse:  # the client decodes base64 vectors before anyone sees them
            data = {**data, "data": [{**e, "embedding": decode_embedding(e["embedding"])} for e in data["data"]]}
        client.model_validate(data)
    return parsed


class StreamError(Exception):
    """What the client's APIError would carry for an error event."""

    def __init__(self, error: dict):
        super().__init__(error.get("message"))
        self.error = error


_LINE_END = re.compile(rb"\r\n|\r|\n")


def _lines(pieces: Iterable[bytes]) -> Iterator[str]:
    buffer = b""
    for piece in pieces:
        buffer += piece
        while True:
            match = _LINE_END.search(buffer)
            # A lone CR at the end of what arrived may be the first half of a CRLF: wait for more.
            if match is None or (match.group() == b"\r" and match.end() == len(buffer)):
                break
            yield buffer[:match.start()].decode("utf-8")
            buffer = buffer[match.end():]
    if buffer:
        yield from (line.decode("utf-8") for line in _LINE_END.split(buffer))


def events(pieces: Iterable[bytes]) -> Iterator[str]:
    """Each event's data, as the client's SSEDecoder assembles it."""
    data: list[str] = []
    for line in _lines(pieces):
        if not line:
            if data:
                yield "\n".join(data)
            data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value.removeprefix(" "))
    if data:
        yield "\n".join(data)


def decode_stream(pieces: Iterable[bytes], shape) -> list[Any]:
    """The chunks the client's Stream would yield, validated as `shape`; StreamError for an error
    event. Raises AssertionError when the stream does not end with [DONE] (the client would stop
    silently: a stream cut short)."""
    chunks = []
    for data in events(pieces):
        if data.startswith("[DONE]"):
            return chunks
        decoded = json.loads(data)
        if isinstance(decoded, dict) and decoded.get("error"):
            raise StreamError(decoded["error"])
        chunks.append(validate(shape, decoded))
    raise AssertionError("the stream ended without data: [DONE]")


def decode_embedding(value: Union[str, list[float]]) -> list[float]:
    """The client's base64 decoding (native float32, which is little-endian here)."""
    if isinstance(value, str):
        return array.array("f", base64.b64decode(value)).tolist()
    return value
