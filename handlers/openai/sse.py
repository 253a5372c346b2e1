"""Server-Sent Events as OpenAI streams them: one `data: <json>` event per chunk, `[DONE]` last."""

from __future__ import annotations

from typing import Any

from handlers.encoding import json_bytes

DONE = b"data: [DONE]\n\n"
CONTENT_TYPE = "text/event-stream"


def event(payload: Any) -> bytes:
    # JSON never holds a raw newline, so one `data:` line holds the whole payload.
    return b"data: " + json_bytes(payload) + b"\n\n"
