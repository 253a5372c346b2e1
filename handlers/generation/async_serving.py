"""The causal-LM family in TorchServe's asynchronous worker mode (`asyncCommunication: true`).

The frontend hands the worker each request as it arrives and never waits for a step; every request
is one coroutine here (`async def handle`, ts/async_service.py). It decodes its request, hands it to
the engine loop (engine_loop.py: one thread stepping the continuous batch at the engine's speed),
then streams what the loop makes: a streamed request gets NDJSON lines (`{"text": ...}`, the last
one with finish_reason and token counts) through TorchServe's intermediate responses, everything
that arrived since its last line in one; a non-streamed request one JSON answer at the end. The
text and the summary are the step-per-call mode's (serving.py); a stream may cut its lines elsewhere.

TorchServe 0.12's asynchronous protocol tells a worker nothing when a client hangs up: its request
runs to its end (max_new_tokens bounds it). A fault of the model fails only the requests the loop
held, each with a 500.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Optional

from handlers.encoding import JSON, json_bytes
from handlers.errors import BadInput, HandlerError
from handlers.generation.engine import Engine
from handlers.generation.engine_loop import Chunk, Done, EngineLoop, Event, Failed, LoopStats, Ticket
from handlers.generation.params import GenerationRequest
from handlers.generation.serving import NDJSON, PRIORITIES, send_intermediate

log = logging.getLogger(__name__)


class AsyncGenerationService:
    """`decode(data, context, indices) -> [GenerationRequest | HandlerError]` and `reject(context, idx,
    err) -> bytes`: the handler's own; `emit(stats, engine)`: Prometheus, from the loop's thread."""

    def __init__(self, engine: Engine, model_name: str, decode: Callable, reject: Callable,
                 max_running: int = 0, priority_of: Callable[[Any, int], Optional[str]] = lambda c, i: None,
                 emit: Optional[Callable[[LoopStats, Engine], None]] = None,
                 send: Callable[[Any, dict[int, bytes]], None] = send_intermediate,
                 warm_request: Optional[GenerationRequest] = None) -> None:
        self.engine = engine
        self.model_name = model_name
        self.decode = decode
        self.reject = reject
        self.priority_of = priority_of
        self.send = send
        self.warm_request = warm_request
        self.loop = EngineLoop(engine, max_running, on_stats=None if emit is None else (lambda s: emit(s, engine)))
        self._started = False

    def warm_up(self, size: int) -> None:
        """A few tokens for `size` sequences at once, before the loop owns the engine."""
        self.engine.generate([(f"warm-up-{i}", self.warm_request) for i in range(size)])

    async def handle(self, data: list[Any], context) -> list[bytes]:
        if not self._started:  # the loop takes the engine once warm-up and start-up are over
            self.loop.start()
            self._started = True
        return list(await asyncio.gather(*(self._one(data, context, idx) for idx in range(len(data)))))

    async def _one(self, data: list[Any], context, idx: int) -> bytes:
        (outcome,) = self.decode([data[idx]], context, [idx])
        priority = self.priority_of(context, idx)
        if not isinstance(outcome, HandlerError) and priority is not None \
                and priority.strip().lower() not in PRIORITIES:
            outcome = BadInput(f"X-Priority: {priority[:40]!r} is not one of high, normal, low")
        if isinstance(outcome, HandlerError):
            return self.reject(context, idx, outcome)
        request: GenerationRequest = outcome
        events: asyncio.Queue[Event] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.loop.submit(Ticket(context.request_ids[idx], request,
                                lambda event: loop.call_soon_threadsafe(events.put_nowait, event),
                                PRIORITIES[priority.strip().lower()] if priority is not None else 1))
        context.set_response_content_type(idx, NDJSON if request.stream else JSON)
        text: list[str] = []
        while True:
            arrived = [await events.get()]
            while not events.empty():  # whatever came meanwhile goes out in one line
                arrived.append(events.get_nowait())
            last = arrived[-1]
            text.extend(e.text for e in arrived if isinstance(e, (Chunk, Done)))
            if isinstance(last, Failed):
                return self.reject(context, idx, last.error)
            if isinstance(last, Done):
                summary = {"finish_reason": last.finish, "prompt_tokens": last.prompt_tokens,
                           "generated_tokens": last.generated_tokens}
                answer = json_bytes({"text": "".join(text), **summary})
                return answer + b"\n" if request.stream else answer
            if request.stream and any(text):
                self.send(context, {idx: json_bytes({"text": "".join(text)}) + b"\n"})
                text.clear()
