"""The causal-LM family in TorchServe's asynchronous worker mode (`asyncCommunication: true`).

The frontend hands the worker each request as it arrives and never waits for a step; every request
is one coroutine here (`async def handle`, ts/async_service.py). It checks its request, hands it to
the engine loop (engine_loop.py: one thread stepping the continuous batch at the engine's speed),
then sends what the loop makes, everything that arrived since its last message in one:

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
from collections.abc import Awaitable, Callable
from typing import Any, Optional, Union

from handlers import kserve
from handlers.encoding import JSON, json_bytes
from handlers.errors import BadInput, HandlerError
from handlers.generation.engine import Engine
from handlers.generation.engine_loop import Chunk, Done, EngineLoop, Event, Failed, LoopStats, Ticket
from handlers.generation.params import GenerationRequest
from handlers.generation.serving import NDJSON, PRIORITIES, send_intermediate
from handlers.openai import responses, routes, sse
from handlers.openai.completions import Call, parse_chat, parse_completion
from handlers.openai.errors import error_body, error_event
from handlers.openai.models import model_response, models_response
from handlers.request_parts import request_headers

log = logging.getLogger(__name__)

Sender = Callable[[str], Awaitable[None]]


class AsyncGenerationService:
    """`decode(data, context, indices) -> [GenerationRequest | HandlerError]` and `reject(context, idx,
    err) -> bytes`: the handler's own; `family`: the causal-LM family (encode, limits, chat template);
    `emit(stats, engine)`: Prometheus, from the loop's thread."""

    def __init__(self, engine: Engine, model_name: str, decode: Callable, reject: Callable, family: Any = None,
                 max_running: int = 0, priority_of: Callable[[Any, int], Optional[str]] = lambda c, i: None,
                 emit: Optional[Callable[[LoopStats, Engine], None]] = None,
                 send: Callable[[Any, dict[int, bytes]], None] = send_intermediate,
                 warm_request: Optional[GenerationRequest] = None) -> None:
        self.engine = engine
        self.model_name = model_name
        self.decode = decode
        self.reject = reject
        self.family = family
        self.priority_of = priority_of
        self.send = send
        self.warm_request = warm_request
        self.loop = EngineLoop(engine, max_running, on_stats=None if emit is None else (lambda s: emit(s, engine)))
        self.loaded_at = int(time.time())
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

        async def line(text: str) -> None:
            self.send(context, {idx: json_bytes({"text": text}) + b"\n"})

        text, last = await self._generate(context.request_ids[idx], request, priority,
                                          line if request.stream else None)
        if isinstance(last, Failed):
            return self.reject(context, idx, last.error)
        answer = json_bytes({"text": text, "finish_reason": last.finish, "prompt_tokens": last.prompt_tokens,
                             "generated_tokens": last.generated_tokens})
        return answer + b"\n" if request.stream else answer

    def _priority(self, context, idx: int) -> Union[int, HandlerError]:
        priority = self.priority_of(context, idx)
        if priority is None:
            return 1
        if priority.strip().lower() not in PRIORITIES:
            return BadInput(f"X-Priority: {priority[:40]!r} is not one of high, normal, low")
        return PRIORITIES[priority.strip().lower()]

    async def _generate(self, key: str, request: GenerationRequest, priority: int,
                        stream: Optional[Sender]) -> tuple[str, Union[Done, Failed]]:
        """Run one request through the loop; `stream`, if given, gets the text as it comes (one
        call per batch of events); returns the text not streamed and the last event."""
        events: asyncio.Queue[Event] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.loop.submit(Ticket(key, request, lambda event: loop.call_soon_threadsafe(events.put_nowait, event),
                                priority))
        pending: list[str] = []
        while True:
            arrived = [await events.get()]
            while not events.empty():  # whatever came meanwhile goes out in one message
                arrived.append(events.get_nowait())
            pending.extend(e.text for e in arrived if isinstance(e, (Chunk, Done)))
            last = arrived[-1]
            if isinstance(last, (Done, Failed)):
                return "".join(pending), last
            if stream is not None and any(pending):
                await stream("".join(pending))
                pending.clear()

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
            context.set_response_status(err.status, err.message[:200], idx)
            return error_body(err)
        if not call.stream:
            text, last = await self._generate(context.request_ids[idx], call.request, priority, None)
            if isinstance(last, Failed):
                context.set_response_status(last.error.status, last.error.message[:200], idx)
                return error_body(last.error)
            return responses.response(call, text, last.finish, last.prompt_tokens, last.generated_tokens)
        context.set_response_content_type(idx, sse.CONTENT_TYPE)
        first = [True]

        async def event(text: str) -> None:
            self.send(context, {idx: responses.chunk(call, text, first=first[0])})
            first[0] = False

        text, last = await self._generate(context.request_ids[idx], call.request, priority, event)
        if isinstance(last, Failed):  # the stream has started: the error is its last event
            return error_event(last.error) + sse.DONE
        end = responses.chunk(call, text, first=first[0]) if text or first[0] else b""
        return (end + responses.chunk(call, "", finish=last.finish)
                + responses.stream_end(call, last.prompt_tokens, last.generated_tokens))

    def _call(self, endpoint: str, body: Any, request_id: str) -> Call:
        family = self.family
        if endpoint == routes.CHAT:
            return parse_chat(body, family.encode, family.limits, self.model_name,
                              family.chat_template, family.bos_token or "", family.eos_token or "",
                              request_id=request_id)
        return parse_completion(body, family.encode, family.limits, self.model_name, request_id=request_id)


def _body(request: Any) -> Any:
    """What the client sent: TorchServe parses an application/json body already; else bytes."""
    if isinstance(request, dict):
        for key in ("body", "data"):
            if key in request:
                return request[key]
    return request
