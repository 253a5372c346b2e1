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

The service reads `Request` records (handlers/request.py) the engine adapter built and returns a
`Reply` per request; what it streams goes out through the adapter's `send_step` (a RecordDoor,
door.py), so it runs behind any engine adapter, TorchServe's (handlers/async_handler.py) or another.

TorchServe 0.12's asynchronous protocol tells a worker nothing when a client hangs up: its request
runs to its end (max_new_tokens bounds it). A fault of the model fails only the requests the loop
held, each with a 500.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

from handlers.encoding import JSON, json_bytes
from handlers.errors import HandlerError
from handlers.generation.admission import priority_level
from handlers.generation.door import RecordDoor
from handlers.generation.engine import Engine
from handlers.generation.engine_loop import Chunk, Done, EngineLoop, Event, Failed, LoopStats, Ticket
from handlers.generation.params import GenerationRequest
from handlers.generation.serving import NDJSON
from handlers.openai import responses, routes, sse
from handlers.openai.completions import Call, parse_chat, parse_completion
from handlers.openai.errors import error_event
from handlers.openai.models import model_response, models_response
from handlers.protocols import Reply
from handlers.request import OPENAI, Request

log = logging.getLogger(__name__)


class AsyncGenerationService:
    """`door`: the engine adapter's side (decode, refuse, send_step: door.py RecordDoor); `family`:
    the causal-LM family (encode, limits, chat template); `emit(stats, engine)`: the metrics, from
    the loop's thread."""

    def __init__(self, engine: Engine, model_name: str, door: RecordDoor, family: Any = None,
                 max_running: int = 0, *, emit: Optional[Callable[[LoopStats, Engine], None]] = None,
                 warm_request: Optional[GenerationRequest] = None) -> None:
        self.engine = engine
        self.model_name = model_name
        self.door = door
        self.family = family
        self.warm_request = warm_request
        self.outbox = StepMessages(lambda parts: self.door.send_step(parts))
        self.loop = EngineLoop(engine, max_running, on_stats=None if emit is None else (lambda s: emit(s, engine)),
                               after_step=self.outbox.flush)
        self.loaded_at = int(time.time())

    def warm_up(self, size: int) -> None:
        """A few tokens for `size` sequences at once, before the loop owns the engine."""
        self.engine.generate([(f"warm-up-{i}", self.warm_request) for i in range(size)])

    async def serve(self, requests: Sequence[Request], context: Any = None) -> list[Reply]:
        """Each request's Reply (`context`: what the adapter hands back with a step's chunks)."""
        self.loop.ensure_running()  # the loop takes the engine once warm-up and start-up are over
        return list(await asyncio.gather(*(self._one(request, context) for request in requests)))

    async def _one(self, request: Request, context: Any) -> Reply:
        if request.route == OPENAI:
            return await self._openai(request, context)
        outcome = self.door.decode(request)
        if isinstance(outcome, HandlerError):
            return self.door.refuse(request, outcome)
        priority = priority_level(request.priority)
        if isinstance(priority, HandlerError):
            return self.door.refuse(request, priority)
        wanted: GenerationRequest = outcome
        media_type = NDJSON if wanted.stream else JSON

        def line(chunk: Chunk) -> bytes:
            return json_bytes({"text": chunk.text}) + b"\n"

        text, last = await self._generate(context, request, wanted, priority,
                                          (line, media_type) if wanted.stream else None)
        if isinstance(last, Failed):
            return self.door.refuse(request, last.error)
        answer = json_bytes({"text": text, "finish_reason": last.finish, "prompt_tokens": last.prompt_tokens,
                             "generated_tokens": last.generated_tokens})
        return Reply(answer + b"\n" if wanted.stream else answer, media_type)

    async def _generate(self, context: Any, request: Request, wanted: GenerationRequest, priority: int,
                        stream: Optional[tuple[Callable[[Chunk], bytes], str]]) -> tuple[str, Union[Done, Failed]]:
        """Run one request through the loop. `stream`, if given: what turns new text into the bytes
        to send, and their content type; they go out with the other requests' of the same step in
        one message (StepMessages). Returns the text not streamed and the last event."""
        finished: asyncio.Future = asyncio.get_running_loop().create_future()
        kept: list[str] = []

        def deliver(event: Event) -> None:  # on the loop's thread, from the engine loop's step
            if isinstance(event, Chunk):
                if stream is None:
                    kept.append(event.text)
                elif event.text:
                    self.outbox.add(context, request, Reply(stream[0](event), stream[1]))
            elif not finished.done():
                finished.set_result(event)

        self.loop.submit(Ticket(request.request_id or uuid.uuid4().hex, wanted, deliver, priority))
        last = await finished
        return "".join(kept) + (last.text if isinstance(last, Done) else ""), last

    # ---- OpenAI's API ----------------------------------------------------------------------------
    async def _openai(self, request: Request, context: Any) -> Reply:
        try:
            if request.error is not None:  # a body in several form fields
                raise request.error
            route = routes.route(request.url_path, routes.GENERATION_ENDPOINTS)
            if route.endpoint == routes.MODELS:
                return Reply(models_response(self.model_name, self.loaded_at), JSON)
            if route.endpoint == routes.MODEL:
                return Reply(model_response(route.model, self.model_name, self.loaded_at), JSON)
            call = self._call(route.endpoint, request.json, request.request_id)
            priority = priority_level(request.priority)
            if isinstance(priority, HandlerError):
                raise priority
        except HandlerError as err:
            return self.door.refuse(request, err)
        if not call.stream:
            text, last = await self._generate(context, request, call.request, priority, None)
            if isinstance(last, Failed):
                return self.door.refuse(request, last.error)
            return Reply(responses.response(call, text, last.finish, last.prompt_tokens, last.generated_tokens), JSON)
        first = [True]

        def event(chunk: Chunk) -> bytes:
            piece = responses.chunk(call, chunk.text, first=first[0],
                                    counts=(chunk.prompt_tokens, chunk.generated_tokens))
            first[0] = False
            return piece

        text, last = await self._generate(context, request, call.request, priority, (event, sse.CONTENT_TYPE))
        if isinstance(last, Failed):  # the stream has started: the error is its last event
            return Reply(error_event(last.error) + sse.DONE, sse.CONTENT_TYPE)
        counts = (last.prompt_tokens, last.generated_tokens)
        end = responses.chunk(call, text, first=first[0], counts=counts) if text or first[0] else b""
        return Reply(end + responses.chunk(call, "", finish=last.finish, counts=counts)
                     + responses.stream_end(call, last.prompt_tokens, last.generated_tokens), sse.CONTENT_TYPE)

    def _call(self, endpoint: str, body: Any, request_id: Optional[str]) -> Call:
        family = self.family
        if endpoint == routes.CHAT:
            return parse_chat(body, family.encode, family.limits, self.model_name,
                              family.chat_template, family.bos_token or "", family.eos_token or "",
                              request_id=request_id)
        return parse_completion(body, family.encode, family.limits, self.model_name, request_id=request_id)


class StepMessages:
    """What one engine step streams, to every request it moved, handed to the engine adapter at once
    (TorchServe's sends it as one message: per step, one encoding and one socket write in the worker
    and one message for the frontend to read, instead of one per request)."""

    def __init__(self, send: Callable[[list[tuple[Any, Request, Reply]]], None]) -> None:
        self.send = send
        self._pending: dict[tuple[int, int], tuple[Any, Request, Reply]] = {}

    def add(self, context: Any, request: Request, chunk: Reply) -> None:
        key = (id(context), request.index)
        held = self._pending.get(key)
        if held is not None:
            chunk = Reply(held[2].body + chunk.body, chunk.content_type)
        self._pending[key] = (context, request, chunk)

    def flush(self) -> None:
        if not self._pending:
            return
        parts, self._pending = list(self._pending.values()), {}
        self.send(parts)
