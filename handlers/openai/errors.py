"""OpenAI's error shape, for our own errors and any other HandlerError:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "n", "code": null}}

The `openai` client raises BadRequestError, NotFoundError, ... from the HTTP status and reads
`param`, `type` and `code` from this body; inside a stream it reads the same object from a
`data: {"error": ...}` event and raises APIError.
"""

from __future__ import annotations

from typing import Optional

from handlers.encoding import json_bytes
from handlers.errors import BadInput, HandlerError
from handlers.openai import sse

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class OpenAIError(HandlerError):
    """A request refused in OpenAI's terms: its status, `type`, `param` and `code` go to the client as they are."""

    kind = "OpenAIError"

    def __init__(self, message: str, param: Optional[str] = None, type: str = INVALID_REQUEST,
                 code: Optional[str] = None, status: int = 400):
        super().__init__(message, param=param)
        self.type = type
        self.code = code
        self.status = status


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(f"The model `{model}` does not exist or is not served at this address.", param="model",
                       code="model_not_found", status=404)


def unsupported_value(param: str, why: str) -> OpenAIError:
    return OpenAIError(f"Unsupported value for '{param}': {why}", param=param, code="unsupported_value")


def invalid_type(param: str, expected: str, value) -> OpenAIError:
    return OpenAIError(f"Invalid type for '{param}': expected {expected}, got {_json_type(value)}", param=param,
                       code="invalid_type")


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"[:60]
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _type_and_code(err: HandlerError) -> tuple[str, Optional[str]]:
    if isinstance(err, OpenAIError):
        return err.type, err.code
    if isinstance(err, BadInput):  # PayloadTooLarge and UnsupportedMediaType too: their status tells them apart
        return INVALID_REQUEST, None
    return SERVER_ERROR, None  # ServerFault, ConfigError: ours, not the request's


def error_object(err: HandlerError) -> dict:
    type_, code = _type_and_code(err)
    return {"message": err.message, "type": type_, "param": getattr(err, "param", None), "code": code}


def error_body(err: HandlerError) -> bytes:
    """The JSON body of a refused request; its HTTP status is `err.status`."""
    return json_bytes({"error": error_object(err)})


def error_event(err: HandlerError) -> bytes:
    """A stream's failure after its first chunk went out (the status is already 200): the `openai`
    client raises APIError with this message. No `[DONE]` follows."""
    return sse.event({"error": error_object(err)})
