"""POST v1/embeddings for text embedders.

    {"model": "<model>", "input": "text" | ["text", ...], "encoding_format": "float" | "base64"}
    -> {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [...]}],
        "model": "<model>", "usage": {"prompt_tokens": 5, "total_tokens": 5}}

"base64" is the little-endian float32 bytes of each vector: the `openai` Python client asks for it
whenever its caller names no encoding_format, and decodes it back to floats. Token-array inputs
are refused; `dimensions` is accepted only when it is the model's own size (vectors are never
shortened); `user` is accepted and ignored; any other field is a 400. A request holds at most
MAX_INSTANCES texts (handlers/limits.py), the bound every route applies to a request's inputs.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from handlers.encoding import json_bytes
from handlers.errors import HandlerError
from handlers.json_body import parse_json
from handlers.limits import MAX_INSTANCES
from handlers.openai.bodies import embeddings_schema, validated
from handlers.openai.errors import OpenAIError, invalid_type, unsupported_value
from handlers.openai.fields import served_model

ENCODING_FORMATS = ("float", "base64")
MAX_INPUTS = MAX_INSTANCES  # texts per request: every route's bound (OpenAI's own API takes 2048)


@dataclass(frozen=True)
class EmbeddingsCall:
    texts: tuple[str, ...]  # in the order answered
    encoding_format: str  # "float" | "base64"
    model: str  # as the client named it


def parse_embeddings(body: Any, model_name: str, dimensions: Optional[int] = None, aliases: Sequence[str] = (),
                     check: Optional[Callable[[str], str]] = None, max_inputs: int = MAX_INPUTS) -> EmbeddingsCall:
    """`dimensions`: the model's vector size, when known; `check`: the family's own check of one
    text (text -> the text to embed; its HandlerError becomes this request's, naming `input`)."""
    if isinstance(body, (bytes, bytearray)):  # JSON TorchServe could not parse (nested too deep, say)
        body = parse_json(bytes(body))
    checked = validated(embeddings_schema(), body)
    model = served_model(body, (model_name, *aliases))
    texts = _texts(body.get("input"), max_inputs)
    if check is not None:
        texts = tuple(_checked(check, text, i, len(texts)) for i, text in enumerate(texts))
    encoding = body.get("encoding_format")
    if encoding is None:
        encoding = "float"
    if not isinstance(encoding, str) or encoding not in ENCODING_FORMATS:
        raise OpenAIError(f"Invalid value for 'encoding_format': expected one of {', '.join(ENCODING_FORMATS)}, "
                          f"got {encoding!r}"[:300], param="encoding_format")
    wanted = checked.dimensions
    if wanted is not None:
        if wanted != dimensions:
            size = f"its {dimensions}" if dimensions is not None else "its own size"
            raise unsupported_value("dimensions", f"this model's vectors cannot be shortened: send {size} or nothing")
    return EmbeddingsCall(texts, encoding, model)


def _texts(value: Any, max_inputs: int) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if value is None:
        raise OpenAIError("Missing required parameter: 'input'", param="input")
    if not isinstance(value, list) or not value:
        raise invalid_type("input", "a string or a non-empty array of strings", value)
    if all(isinstance(v, str) for v in value):
        if len(value) > max_inputs:
            raise OpenAIError(f"'input' holds {len(value)} texts, over the limit of {max_inputs} per request: split "
                              "the request", param="input")
        return tuple(value)
    if all(isinstance(v, (int, list)) and not isinstance(v, bool) for v in value):
        raise unsupported_value("input", "token arrays are not supported: send text")
    raise invalid_type("input", "a string or a non-empty array of strings", value)


def _checked(check: Callable[[str], str], text: str, i: int, count: int) -> str:
    try:
        return check(text)
    except HandlerError as err:
        where = "input" if count == 1 else f"input[{i}]"
        raise OpenAIError(f"{where}: {err.message}"[:500], param="input", status=err.status) from None


def _encoded(vector: Any, encoding_format: str) -> Any:
    if encoding_format == "base64":
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return np.ascontiguousarray(vector) if isinstance(vector, np.ndarray) else vector  # orjson takes contiguous arrays


def embeddings_response(vectors: Sequence[Any], model: str, prompt_tokens: int,
                        encoding_format: str = "float") -> bytes:
    """`vectors`: one per text, in order (lists of floats or NumPy arrays); `prompt_tokens`: all texts' tokens."""
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v, encoding_format)}
            for i, v in enumerate(vectors)]
    return json_bytes({"object": "list", "data": data, "model": model,
                       "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})
