"""Which OpenAI request fields are honoured, which are accepted but change nothing, which are refused.

A field we cannot honour is accepted with a value that asks for nothing more than OpenAI's default
(`"n": 1`, `"logprobs": false`, `"tools": []`, null): clients and SDKs send these defaults
explicitly. Any other value is a 400 naming it (code "unsupported_value"), never silently ignored,
since the answer would not be what was asked for. Fields that only label a request for OpenAI's own
bookkeeping (`user`, `metadata`, ...) are accepted with any value of their type. A field OpenAI does
not have is a 400 ("Unrecognized request argument"), except our two extensions, the ones vLLM's
OpenAI server also takes: `top_k` and `ignore_eos`. These tables make the request models (bodies.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from handlers.openai.errors import invalid_type, model_not_found

EXTENSIONS = ("top_k", "ignore_eos")


@dataclass(frozen=True)
class Neutral:
    """Refused unless null or one of `values` (what OpenAI does by default)."""

    values: tuple[Any, ...]
    why: str  # the client reads it when refused


@dataclass(frozen=True)
class Ignored:
    """Accepted, null or any value of its type; the answer does not depend on it."""

    types: tuple[type, ...]
    expected: str


_PENALTY = "penalties are not supported (only 0)"
_SHARED_NEUTRAL = {
    "n": Neutral((1,), "only 1: one choice per request (send several requests)"),
    "frequency_penalty": Neutral((0,), _PENALTY),
    "presence_penalty": Neutral((0,), _PENALTY),
    "logit_bias": Neutral(({},), "logit bias is not supported"),
}
_STRING = Ignored((str,), "a string")

COMPLETION_HONOURED = frozenset({"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream",
                                 "stream_options", *EXTENSIONS})
COMPLETION_NEUTRAL: Mapping[str, Neutral] = MappingProxyType({
    **_SHARED_NEUTRAL,
    "best_of": Neutral((1,), "only 1"),
    "echo": Neutral((False,), "the prompt is not echoed"),
    "logprobs": Neutral((), "log probabilities are not returned"),
    "suffix": Neutral(("",), "insertion (a suffix) is not supported"),
})
COMPLETION_IGNORED: Mapping[str, Ignored] = MappingProxyType({"user": _STRING})

CHAT_HONOURED = frozenset({"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                           "seed", "stop", "stream", "stream_options", *EXTENSIONS})
_NO_TOOLS = "tools and function calling are not supported"
CHAT_NEUTRAL: Mapping[str, Neutral] = MappingProxyType({
    **_SHARED_NEUTRAL,
    "logprobs": Neutral((False,), "log probabilities are not returned"),
    "top_logprobs": Neutral((0,), "log probabilities are not returned"),
    "tools": Neutral(([],), _NO_TOOLS),
    "tool_choice": Neutral(("none",), _NO_TOOLS),
    "functions": Neutral(([],), _NO_TOOLS),
    "function_call": Neutral(("none",), _NO_TOOLS),
    "response_format": Neutral(({"type": "text"},), "only plain text: no JSON mode or JSON schema"),
    "modalities": Neutral((["text"],), "text only"),
    "audio": Neutral((), "text only"),
    "prediction": Neutral((), "predicted outputs are not supported"),
    "reasoning_effort": Neutral((), "not a reasoning model"),
    "verbosity": Neutral((), "not supported"),
    "web_search_options": Neutral((), "web search is not supported"),
    "store": Neutral((False,), "completions are not stored"),
    "service_tier": Neutral(("auto", "default"), "one service tier"),
})
CHAT_IGNORED: Mapping[str, Ignored] = MappingProxyType({
    "user": _STRING,
    "safety_identifier": _STRING,
    "prompt_cache_key": _STRING,  # prefix caching, when the archive has it, needs no key
    "metadata": Ignored((dict,), "an object"),
    "parallel_tool_calls": Ignored((bool,), "a boolean"),  # means nothing without tools
})


EMBEDDINGS_HONOURED = frozenset({"model", "input", "encoding_format", "dimensions"})
EMBEDDINGS_IGNORED: Mapping[str, Ignored] = MappingProxyType({"user": _STRING})


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: true is not 1, 0 is 0.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def served_model(body: Mapping[str, Any], names: Sequence[str]) -> str:
    """The model named, to echo in answers: one of `names` (the first when the body names none)."""
    model = body.get("model")
    if model is None:
        return names[0]
    if not isinstance(model, str):
        raise invalid_type("model", "a string", model)
    if model not in names:
        raise model_not_found(model)
    return model
