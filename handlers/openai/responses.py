"""The engine's results -> OpenAI's answers to a `Call` (completions.py), whole or streamed.

Whole: one JSON body (`text_completion` / `chat.completion`) with `usage`. Streamed: Server-Sent
Events, as OpenAI sends them:

    chat_chunk(call, "", role_first=True)    data: {"object": "chat.completion.chunk", ...,
                                               "choices": [{"index": 0, "finish_reason": null,
                                                            "delta": {"role": "assistant", "content": ""}}]}
    chat_chunk(call, "Hel")                  data: {... "delta": {"content": "Hel"} ...}
    chat_chunk(call, "", finish="stop")      data: {... "delta": {}, "finish_reason": "stop"}
    stream_end(call, prompt, generated)      data: {... "choices": [], "usage": {...}}  (with include_usage)
                                             data: [DONE]

Every chunk of a call has the same id, created and model; with include_usage, every chunk carries
`"usage": null` until the usage chunk. Completions stream `text_completion` objects whose choices
hold `text`. Our finish reasons ("stop": end of text or a stop string, "length") are OpenAI's.
"""

from __future__ import annotations

from typing import Any, Optional

from handlers.encoding import json_bytes
from handlers.errors import ServerFault
from handlers.openai import sse
from handlers.openai.completions import Call

FINISH_REASONS = ("stop", "length")


def usage(prompt_tokens: int, generated_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": generated_tokens,
            "total_tokens": prompt_tokens + generated_tokens}


def _finish(finish: Optional[str], final: bool = False) -> Optional[str]:
    """`final`: a whole answer, which must say why it ended."""
    if (final or finish is not None) and finish not in FINISH_REASONS:
        raise ServerFault(f"unexpected finish reason {finish!r} (expected one of {', '.join(FINISH_REASONS)})")
    return finish


def _object(call: Call, chunk: bool) -> str:
    if call.chat:
        return "chat.completion.chunk" if chunk else "chat.completion"
    return "text_completion"  # OpenAI's name for streamed completion chunks too


def _head(call: Call, chunk: bool) -> dict[str, Any]:
    return {"id": call.id, "object": _object(call, chunk), "created": call.created, "model": call.model,
            "system_fingerprint": None}


def completion_response(call: Call, text: str, finish: str, prompt_tokens: int, generated_tokens: int) -> bytes:
    """A whole v1/completions answer."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": _finish(finish, final=True)}
    return json_bytes({**_head(call, False), "choices": [choice], "usage": usage(prompt_tokens, generated_tokens)})


def chat_response(call: Call, text: str, finish: str, prompt_tokens: int, generated_tokens: int) -> bytes:
    """A whole v1/chat/completions answer."""
    choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None}, "logprobs": None,
              "finish_reason": _finish(finish, final=True)}
    return json_bytes({**_head(call, False), "choices": [choice], "usage": usage(prompt_tokens, generated_tokens)})


def response(call: Call, text: str, finish: str, prompt_tokens: int, generated_tokens: int) -> bytes:
    """The whole answer for the call's endpoint."""
    answer = chat_response if call.chat else completion_response
    return answer(call, text, finish, prompt_tokens, generated_tokens)


Counts = Optional[tuple[int, int]]  # (prompt tokens, tokens generated so far)


def _chunk(call: Call, choice: dict[str, Any], counts: Counts) -> bytes:
    body = {**_head(call, True), "choices": [choice]}
    if call.include_usage:
        body["usage"] = usage(*counts) if call.continuous_usage and counts is not None else None
    return sse.event(body)


def completion_chunk(call: Call, text: str, finish: Optional[str] = None, counts: Counts = None) -> bytes:
    """One streamed piece of a completion; `finish` on the last."""
    return _chunk(call, {"index": 0, "text": text, "logprobs": None, "finish_reason": _finish(finish)}, counts)


def chat_chunk(call: Call, delta_text: str, role_first: bool = False, finish: Optional[str] = None,
               counts: Counts = None) -> bytes:
    """One streamed piece of a chat answer. `role_first` on the first chunk (OpenAI's first chunk
    names the role, with content "" or the first text); `finish` on the last."""
    delta: dict[str, Any] = {"role": "assistant", "content": delta_text} if role_first else {}
    if delta_text and not role_first:
        delta["content"] = delta_text
    return _chunk(call, {"index": 0, "delta": delta, "logprobs": None, "finish_reason": _finish(finish)}, counts)


def chunk(call: Call, text: str, first: bool = False, finish: Optional[str] = None, counts: Counts = None) -> bytes:
    """The streamed piece for the call's endpoint (`first`: the stream's first chunk; `counts`: the
    token counts so far, sent in every chunk when the call asked for continuous usage)."""
    if call.chat:
        return chat_chunk(call, text, role_first=first, finish=finish, counts=counts)
    return completion_chunk(call, text, finish, counts)


def stream_end(call: Call, prompt_tokens: int, generated_tokens: int) -> bytes:
    """After the chunk carrying finish_reason: the usage chunk (with include_usage), then [DONE]."""
    if not call.include_usage:
        return sse.DONE
    body = {**_head(call, True), "choices": [], "usage": usage(prompt_tokens, generated_tokens)}
    return sse.event(body) + sse.DONE
