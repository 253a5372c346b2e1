"""GET v1/models and v1/models/<model>: the one model served at this address.

    {"object": "list", "data": [{"id": "tinylm", "object": "model", "created": 1718000000, "owned_by": "torchserve"}]}
"""

from __future__ import annotations

from collections.abc import Sequence

from handlers.encoding import json_bytes
from handlers.openai.errors import model_not_found

OWNED_BY = "torchserve"


def model_object(model_name: str, created: int, owned_by: str = OWNED_BY) -> dict[str, object]:
    return {"id": model_name, "object": "model", "created": int(created), "owned_by": owned_by}


def models_response(model_name: str, created: int, owned_by: str = OWNED_BY) -> bytes:
    """`created`: Unix seconds, say when the model was loaded."""
    return json_bytes({"object": "list", "data": [model_object(model_name, created, owned_by)]})


def model_response(asked: str, model_name: str, created: int, aliases: Sequence[str] = (),
                   owned_by: str = OWNED_BY) -> bytes:
    """GET v1/models/<asked> (the openai client's models.retrieve): 404 unless it names this model."""
    if asked != model_name and asked not in aliases:
        raise model_not_found(asked)
    return json_bytes(model_object(asked, created, owned_by))
