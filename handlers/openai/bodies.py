"""OpenAI request bodies as pydantic models: the fields each endpoint takes and their types, unknown
fields refused (extra="forbid", strict: `true` is not 1), built from fields.py's tables of what is
honoured, neutral or ignored.

`validated(schema, body)` words pydantic's report (through handlers/schemas.py) as our OpenAIError, in
the words OpenAI's API uses: "Unrecognized request argument supplied: <field>", "Invalid type for
'<field>': expected ..., got ...", "Unsupported value for '<field>': <why>". When a body has several
faults the one named is the one a reader meets first: the fields we do not honour in the body's
order, then `model`, `stream`, `stream_options`, `dimensions`. What depends on several fields or on
the model (the prompt and its limits, the chat messages, the model's name) is checked after, by
completions.py and embeddings.py.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Annotated, Any, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, create_model

from handlers import schemas
from handlers.openai.errors import OpenAIError, invalid_type, unsupported_value
from handlers.openai.fields import (
    CHAT_HONOURED,
    CHAT_IGNORED,
    CHAT_NEUTRAL,
    COMPLETION_HONOURED,
    COMPLETION_IGNORED,
    COMPLETION_NEUTRAL,
    EMBEDDINGS_HONOURED,
    EMBEDDINGS_IGNORED,
    Ignored,
    Neutral,
    same_json,
)

STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)
_EXPECTED = {"string_type": "a string", "bool_type": "a boolean", "int_type": "an integer", "dict_type": "an object",
             "model_type": "an object"}


class StreamOptions(BaseModel):
    """stream_options: include_usage; include_obfuscation is accepted (no obfuscation is sent);
    continuous_usage_stats is vLLM's (benchmark clients send it)."""

    model_config = STRICT

    include_usage: Optional[bool] = None
    include_obfuscation: Optional[bool] = None
    continuous_usage_stats: Optional[bool] = None


# Honoured fields with a type of their own, in the order their faults are named; the others honoured
# (prompt, messages, input, the generation fields) are checked by their own code, with their own words.
TYPED = {"model": Optional[str], "stream": Optional[bool], "stream_options": Optional[StreamOptions],
         "dimensions": Optional[int]}


def _neutral(rule: Neutral):
    def check(value: Any) -> Any:
        if value is not None and not any(same_json(value, v) for v in rule.values):
            raise ValueError(rule.why)  # pydantic reports it as a value_error; refusal() words it
        return value

    return Annotated[Any, AfterValidator(check)]


def _schema(name: str, honoured: frozenset, neutral: Mapping[str, Neutral],
            ignored: Mapping[str, Ignored]) -> type[BaseModel]:
    fields: dict[str, Any] = {field: (TYPED.get(field, Any), None) for field in sorted(honoured)}
    fields.update({field: (_neutral(rule), None) for field, rule in neutral.items()})
    fields.update({field: (Optional[rule.types[0]], None) for field, rule in ignored.items()})
    return create_model(name, __config__=STRICT, **fields)


@functools.cache
def completion_schema() -> type[BaseModel]:
    return _schema("CompletionBody", COMPLETION_HONOURED, COMPLETION_NEUTRAL, COMPLETION_IGNORED)


@functools.cache
def chat_schema() -> type[BaseModel]:
    return _schema("ChatBody", CHAT_HONOURED, CHAT_NEUTRAL, CHAT_IGNORED)


@functools.cache
def embeddings_schema() -> type[BaseModel]:
    return _schema("EmbeddingsBody", EMBEDDINGS_HONOURED, {}, EMBEDDINGS_IGNORED)


def validated(schema: type[BaseModel], body: Any) -> BaseModel:
    """The body checked against `schema`, or the OpenAIError naming its first fault."""
    return schemas.validated(schema, body, refusal)


def refusal(errors: list[dict], body: Any) -> OpenAIError:
    """pydantic's report as OpenAI's 400, naming the field (see the module's docstring)."""
    order = list(body) if isinstance(body, Mapping) else []
    typed = list(TYPED)

    def rank(error: dict) -> tuple:
        loc = error["loc"]
        if not loc:
            return (-1,)
        if loc[0] not in typed:
            return (0, order.index(loc[0]) if loc[0] in order else len(order))
        inner = body.get(loc[0]) if isinstance(body, Mapping) else None
        keys = list(inner) if isinstance(inner, Mapping) else []
        return (1, typed.index(loc[0]), keys.index(loc[1]) if len(loc) > 1 and loc[1] in keys else -1)

    first = min(errors, key=rank)
    loc, kind, value = first["loc"], first["type"], first["input"]
    if not loc:
        return invalid_type("body", "a JSON object", value)
    param = schemas.path(loc)
    if loc[0] == "stream_options" and len(loc) > 1 and body.get("stream") is not True:
        return stream_options_need_stream()
    if kind == "extra_forbidden":
        return OpenAIError(f"Unrecognized request argument supplied: {param}", param=param)
    if kind == "value_error":  # only a neutral field's check raises one
        return unsupported_value(param, str(first["ctx"]["error"]))
    return invalid_type(param, _EXPECTED.get(kind, "a JSON value of another type"), value)


def stream_options_need_stream() -> OpenAIError:
    return OpenAIError("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                       param="stream_options")


def usage_options(body: BaseModel) -> tuple[bool, bool]:
    """(include_usage: a last chunk with the token counts, continuous_usage_stats with it: the counts
    in every chunk), from a validated body's stream_options."""
    options: Optional[StreamOptions] = body.stream_options
    if options is None:
        return False, False
    if body.stream is not True:
        raise stream_options_need_stream()
    return options.include_usage is True, options.include_usage is True and options.continuous_usage_stats is True
