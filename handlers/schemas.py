"""Request bodies checked against pydantic models: the one place a ValidationError becomes one of our
HandlerErrors. Each protocol words the refusal its clients expect (`refusal(errors, value)`: from
pydantic's error list, each with its `loc`, `type` and `input`, to the HandlerError naming the field
and what to send instead); the models live beside their protocols (handlers/openai/bodies.py,
handlers/kserve_envelopes.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from handlers.errors import HandlerError

Model = TypeVar("Model", bound=BaseModel)
Refusal = Callable[[list[dict], Any], HandlerError]


def validated(schema: type[Model], value: Any, refusal: Refusal) -> Model:
    """`value` as `schema`, or the HandlerError `refusal` words from pydantic's report."""
    try:
        return schema.model_validate(value)
    except ValidationError as err:
        raise refusal(err.errors(include_url=False), value) from None


def path(loc: tuple) -> str:
    """A field's place as our messages write it: inputs[0].shape, stream_options.include_usage."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
