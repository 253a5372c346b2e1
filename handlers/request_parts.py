"""One request's parts as TorchServe passes them to a handler: its body, its headers, its content type."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from handlers.errors import BadInput
from handlers.kserve import header


def request_body(request: Any) -> Any:
    """The payload of one request as TorchServe passes it: raw body, or a single form field."""
    if not isinstance(request, dict):
        return request
    for key in ("data", "body"):
        if key in request:
            return request[key]
    if len(request) == 1:
        return next(iter(request.values()))
    raise BadInput("send the input as the request body (or a single form field named 'data')")


def json_value(body: Any) -> Any:
    """A JSON body, whatever form it arrived in: TorchServe's worker parses a body sent as exactly
    `application/json` itself, and hands any other (with a charset parameter, say, or one its own
    parse failed on) over as bytes. Raises BadInput naming what is wrong."""
    if not isinstance(body, (bytes, bytearray, str)):
        return body
    try:
        text = body if isinstance(body, str) else bytes(body).decode("utf-8")
        return json.loads(text)
    except UnicodeDecodeError as err:
        raise BadInput(f"body: not UTF-8 ({err.reason} at byte {err.start})") from None
    except RecursionError:
        raise BadInput("body: JSON nested too deep") from None
    except ValueError as err:
        raise BadInput(f"body: malformed JSON ({err})"[:200]) from None


def request_headers(context, idx: int) -> Mapping[str, Any]:
    try:
        return context.get_all_request_header(idx) or {}
    except (AttributeError, IndexError, KeyError, TypeError):  # contexts without request headers
        return {}


def content_type(context, idx: int) -> str:
    """The media type alone, lower case ("" when none was sent)."""
    value = header(request_headers(context, idx), "content-type")
    return "" if value is None else value.split(";")[0].strip().lower()
