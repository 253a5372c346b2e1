"""The causal-LM family in TorchServe's asynchronous worker mode (`asyncCommunication: true`).

The frontend hands the worker each request as it arrives and never waits for a step; every request
is one coroutine here (`async def handle`, ts/async_service.py). It checks its request, hands it to
the engine loop (engine_loop.py: a task on the same asyncio loop stepping the continuous batch at the
engine's speed), then sends what the loop makes, everything that arrived since its last message in one:

- /predictions/<model>: NDJSON lines when streamed (`{"text": ...}`, the last one with
  finish_reason and token counts), else one JSON answer: the text and the summary of the
  step-per-call mode (serving.py); a stream may cut its lines elsewhere;
- /predictions/<model>/<version>/v1/completions and .../v1/chat/completions (TorchServe's `url_path`
  header): OpenAI's answers, Server-Sent Events when streamed (handlers/openai); .../v1/models too.

TorchServe 0.12's asynchronous protocol tells a worker nothing when a client hangs up: its request
runs to its end (max_new_tokens bounds it). A fault of the model fails only the requests the loop
held, each with a 500.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Optional, Union

from handlers import kserve
from handlers.answers import set_status
from handlers.engines.batch_context import BatchContext
from handlers.encoding import JSON, json_bytes
from handlers.errors import HandlerError
from handlers.generation.admission import priority_level
from handlers.generation.engine import Engine
from handlers.generation.engine_loop import Chunk, Done, EngineLoop, Event, Failed, LoopStats, Ticket
from handlers.generation.params import GenerationRequest
from handlers.generation.serving import NDJSON
from handlers.openai import responses, routes, sse
from handlers.openai.completions import Call, parse_chat, parse_completion
from handlers.openai.errors import error_body, error_event
from handlers.openai.models import model_response, models_response
from handlers.request_parts import json_value, request_headers

log = logging.getLogger(__name__)

class AsyncGenerationService:
    """`decode(data, context, indices) -> [GenerationRequest | HandlerError]` and `reject(context, idx,
    err) -> bytes`: the handler's own; `family`: the causal-LM family (encode, limits, chat template);
    `emit(stats, engine)`: Prometheus, from the loop's thread."""

    def __init__(self, engine: Engine, model_name: str, decode: Callable, reject: Callable, family: Any = None,
                 max_running: int = 0, priority_of: Callable[[Any, int], Optional[str]] = lambda c, i: None,
                 *, emit: Optional[Callable[[LoopStats, Engine], None]] = None,
                 send: Callable[[Any, dict[int, bytes]], None],
                 warm_request: Optional[GenerationRequest] = None) -> None:
        self.engine = engine
        self.model_name = model_name
        self.decode = decode
        self.reject = reject
        self.family = family
        self.priority_of = priority_of
        self.send = send
        self.warm_request = warm_request
        self.outbox = StepMessages(lambda context, chunks: self.send(context, chunks))
        self.loop = EngineLoop(engine, max_running, on_stats=None if emit is None else (lambda s: emit(s, engine)),
                               after_step=self.outbox.flush)
        self.loaded_at = int(time.time())

    def warm_up(self, size: int) -> None:
        """A few tokens for `size` sequences at once, before the loop owns the engine."""
        self.engine.generate([(f"warm-up-{i}", self.warm_request) for i in range(size)])

    async def handle(self, data: list[Any], context) -> list[bytes]:
        self.loop.ensure_running()  # the loop takes the engine once warm-up and start-up are over
        return list(await asyncio.gather(*(self._one(data, context, idx) for idx in range(len(data)))))

    async def _one(self, data: list[Any], context, idx: int) -> bytes:
        headers = request_headers(context, idx)
        url_path = (kserve.header(headers, "url_path") or "").strip("/")
        if routes.is_openai(url_path):
            return await self._openai(data[idx], context, idx, url_path)
        (outcome,) = self.decode([data[idx]], context, [idx])
        priority = self._priority(context, idx)
        if isinstance(outcome, HandlerError):
            return self.reject(context, idx, outcome)
        if isinstance(priority, HandlerError):
            return self.reject(context, idx, priority)
        request: GenerationRequest = outcome
        context.set_response_content_type(idx, NDJSON if request.stream else JSON)

        def line(chunk: Chunk) -> bytes:
            return json_bytes({"text": chunk.text}) + b"\n"

        text, last = await self._generate((context, idx), request, priority, line if request.stream else None)
        if isinstance(last, Failed):
            return self.reject(context, idx, last.error)
        answer = json_bytes({"text": text, "finish_reason": last.finish, "prompt_tokens": last.prompt_tokens,
                             "generated_tokens": last.generated_tokens})
        return answer + b"\n" if request.stream else answer

    def _priority(self, context, idx: int) -> Union[int, HandlerError]:
        return priority_level(self.priority_of(context, idx))

    async def _generate(self, where: tuple[Any, int], request: GenerationRequest, priority: int,
                        stream: Optional[Callable[[Chunk], bytes]]) -> tuple[str, Union[Done, Failed]]:
        """Run one request (`where`: its context and index) through the loop. `stream`, if given,
        turns new text into the bytes to send; they go out with the other requests' of the same
        step in one message (StepMessages). Returns the text not streamed and the last event."""
        context, idx = where
        finished: asyncio.Future = asyncio.get_running_loop().create_future()
        kept: list[str] = []

        def deliver(event: Event) -> None:  # on the loop's thread, from the engine loop's step
            if isinstance(event, Chunk):
                if stream is None:
                    kept.append(event.text)
                elif event.text:
                    self.outbox.add(context, idx, stream(event))
            elif not finished.done():
                finished.set_result(event)

        self.loop.submit(Ticket(context.request_ids[idx], request, deliver, priority))
        last = await finished
        return "".join(kept) + (last.text if isinstance(last, Done) else ""), last

    # ---- OpenAI's API ----------------------------------------------------------------------------
    async def _openai(self, request: Any, context, idx: int, url_path: str) -> bytes:
        context.set_response_content_type(idx, JSON)
        try:
            route = routes.route(url_path, routes.GENERATION_ENDPOINTS)
            if route.endpoint == routes.MODELS:
                return models_response(self.model_name, self.loaded_at)
            if route.endpoint == routes.MODEL:
                return model_response(route.model, self.model_name, self.loaded_at)
            call = self._call(route.endpoint, _body(request), context.request_ids[idx])
            priority = self._priority(context, idx)
            if isinstance(priority, HandlerError):
                raise priority
        except HandlerError as err:
            set_status(context, idx, err)
            return error_body(err)
        if not call.stream:
            text, last = await self._generate((context, idx), call.request, priority, None)
            if isinstance(last, Failed):
                set_status(context, idx, last.error)
                return error_body(last.error)
            return responses.response(call, text, last.finish, last.prompt_tokens, last.generated_tokens)
        context.set_response_content_type(idx, sse.CONTENT_TYPE)
        first = [True]

        def event(chunk: Chunk) -> bytes:
            piece = responses.chunk(call, chunk.text, first=first[0],
                                    counts=(chunk.prompt_tokens, chunk.generated_tokens))
            first[0] = False
            return piece

        text, last = await self._generate((context, idx), call.request, priority, event)
        if isinstance(last, Failed):  # the stream has started: the error is its last event
            return error_event(last.error) + sse.DONE
        counts = (last.prompt_tokens, last.generated_tokens)
        end = responses.chunk(call, text, first=first[0], counts=counts) if text or first[0] else b""
        return (end + responses.chunk(call, "", finish=last.finish, counts=counts)
                + responses.stream_end(call, last.prompt_tokens, last.generated_tokens))

    def _call(self, endpoint: str, body: Any, request_id: str) -> Call:
        family = self.family
        if endpoint == routes.CHAT:
            return parse_chat(body, family.encode, family.limits, self.model_name,
                              family.chat_template, family.bos_token or "", family.eos_token or "",
                              request_id=request_id)
        return parse_completion(body, family.encode, family.limits, self.model_name, request_id=request_id)


class StepMessages:
    """What one engine step streams, to every request it moved, sent as one TorchServe message: per
    step, one encoding and one socket write in the worker and one message for the frontend to read,
    instead of one per request."""

    def __init__(self, send: Callable[[Any, dict[int, bytes]], None]) -> None:
        self.send = send
        self._pending: dict[tuple[int, int], tuple[Any, int, bytes]] = {}

    def add(self, context, idx: int, data: bytes) -> None:
        key = (id(context), idx)
        _, _, before = self._pending.get(key, (context, idx, b""))
        self._pending[key] = (context, idx, before + data)

    def flush(self) -> None:
        if not self._pending:
            return
        parts, self._pending = list(self._pending.values()), {}
        self.send(BatchContext([(context, idx) for context, idx, _ in parts]),
                  {n: data for n, (_, _, data) in enumerate(parts)})


def _body(request: Any) -> Any:
    """What the client sent, as JSON (handlers/request_parts.json_value)."""
    if isinstance(request, dict):
        for key in ("body", "data"):
            if key in request:
                return json_value(request[key])
    return json_value(request)
