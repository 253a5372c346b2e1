"""What the generation loops need from around them, as small interfaces: the model's text side
(`TextModel`, met by the causal-LM family) and the engine adapter's side: `Door` for the step and
whole-batch loops (serving.py), `RecordDoor` for the async engine loop (async_serving.py), which reads
`Request` records and returns `Reply`s. The loops call these and nothing else of the handler or the
engine, so another engine plugs in by building another door.

A `context` here is whatever the adapter hands the loop with a batch and reads back its answers
from; `idx` a request's place in it. The loops set a request's content type on it and, in the
step-per-call mode, TorchServe's `stopping_criteria`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Union

from handlers.errors import HandlerError
from handlers.generation.params import GenerationRequest
from handlers.protocols import Reply
from handlers.request import Request

Decoded = Union[GenerationRequest, HandlerError]


class TextModel(Protocol):
    """The family's side: tokens and text, the model's ends, a request to warm up with."""

    eos_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode_text(self, ids: Sequence[int]) -> str: ...

    def check_model(self, lm: Any) -> int:
        """The LM's longest sequence (positions), or a ConfigError when it cannot be served."""

    def example_request(self) -> GenerationRequest: ...


@dataclass(frozen=True)
class Door:
    """The engine adapter's side.

    decode(bodies, context, indices): each request's GenerationRequest, or the HandlerError refusing it;
    fail(context, idx, err): a refusal's bytes, its status set (its route's error shape);
    stream(context, {idx: bytes}): chunks sent ahead of the answers, one message;
    priority(context, idx): the request's X-Priority header as sent, or None;
    metrics(context): the engine's MetricsSink for this call, or None.
    """

    decode: Callable[[list[Any], Any, list[int]], list[Decoded]]
    fail: Callable[[Any, int, HandlerError], bytes]
    stream: Callable[[Any, dict[int, bytes]], None]
    priority: Callable[[Any, int], Optional[str]] = lambda context, idx: None
    metrics: Callable[[Any], Any] = lambda context: None


@dataclass(frozen=True)
class RecordDoor:
    """The engine adapter's side for a loop over records (the async engine loop).

    decode(request): its GenerationRequest (the family's decode of its body), or the HandlerError refusing it;
    refuse(request, err): the refusal's Reply in its route's error shape (status and message set);
    send_step(parts): one engine step's chunks, [(context, request, Reply)] (each chunk's body and
        content type), to requests that may have come in different contexts: the adapter sends them
        ahead of the answers (TorchServe: one message, handlers/engines/torchserve.py).
    """

    decode: Callable[[Request], Decoded]
    refuse: Callable[[Request, HandlerError], Reply]
    send_step: Callable[[list[tuple[Any, Request, Reply]]], None]
