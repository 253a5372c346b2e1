"""A request's raw headers and JSON body as the generation loops still read them (the batch loop reads
its records instead, handlers/request.py, built by the engine adapter handlers/engines/torchserve.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from handlers.errors import BadInput


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
