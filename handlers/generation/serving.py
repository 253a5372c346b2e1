"""The causal-LM family through TorchServe: sequences kept by request id, answered a step at a time.

Continuous batching (`continuousBatching: true` in the archive's model-config): every call of the
handler is one step. The frontend sends every running request (by id; their bodies only the first
time) plus new ones up to batchSize. A call with new requests prefills them and answers each with
its first token (the running ones wait that one step: new requests get their first token within
one prefill of arriving); a call without new ones advances every running sequence by one token.
A request the frontend stops sending (its client went away) is dropped from the batch at once.

Each call answers every request of its batch: a streamed request gets its new text as one NDJSON
line (`{"text": ...}`; the last line adds finish_reason and token counts), a non-streamed one an
empty chunk until its whole JSON answer. `context.stopping_criteria` tells TorchServe, per request,
whether more is coming (a 400 or an answer complete at once goes out as one plain response).

Priorities (`X-Priority: high | normal | low`, default normal): with `max_running` set, at most that
many normal and low sequences advance together; the others wait here (answered with empty chunks),
high first, then normal, then low, each in order of arrival (admission.py, the async engine loop's
policy too). High-priority sequences always join at once. TorchServe's frontend queue is FIFO and
hands the handler at most batchSize requests: a high-priority request gets ahead only of those
already in the worker, so batchSize should exceed max_running by the headroom high-priority traffic
needs.

Without continuous batching (a plain batching archive) a call runs its whole batch to the end,
streaming through TorchServe's intermediate responses.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Optional

from handlers.encoding import JSON, json_bytes
from handlers.errors import HandlerError, ServerFault
from handlers.generation.admission import Admission, priority_level
from handlers.generation.door import Door
from handlers.generation.engine import Engine, Generation
from handlers.generation.metrics import Figures, TokenRate, emit
from handlers.generation.params import GenerationRequest

log = logging.getLogger(__name__)

NDJSON = "application/x-ndjson"


class _More:
    """One entry of context.stopping_criteria: True, last chunk; False, more to come; None, one
    plain (non-chunked) response."""

    def __init__(self, value: Optional[bool]) -> None:
        self.value = value

    def __call__(self, _answer: Any) -> Optional[bool]:
        return self.value


class GenerationService:
    """The step-per-call loop (or a whole batch per call) behind a Door (door.py): its requests
    decoded, refused and streamed through the engine adapter."""

    def __init__(self, engine: Engine, model_name: str, continuous: bool, door: Door,
                 warm_request: Optional[GenerationRequest] = None, max_running: int = 0) -> None:
        self.engine = engine
        self.model_name = model_name
        self.continuous = continuous
        self.door = door
        self.warm_request = warm_request
        self.live: dict[str, Generation] = {}  # request id -> its running sequence
        self.answered: dict[str, int] = {}  # request id -> responses sent so far
        self.admission = Admission(max_running)

    @property
    def waiting(self) -> list[Generation]:
        """Received, not yet running: by priority, then arrival."""
        return self.admission.waiting

    def warm_up(self, size: int) -> None:
        """A few tokens for `size` sequences at once: the first calls' one-off costs paid at start-up."""
        self.engine.generate([(f"warm-up-{i}", self.warm_request) for i in range(size)])

    def handle(self, data: list[Any], context) -> list[bytes]:
        ids: dict[int, str] = dict(context.request_ids)
        stats = _CallStats(self.model_name)
        self._release_gone(set(ids.values()), stats)
        results: list[Optional[bytes]] = [None] * len(data)
        fresh = [idx for idx in range(len(data)) if ids[idx] not in self.live]
        new: list[tuple[int, Generation]] = []
        for idx, outcome in zip(fresh, self.door.decode([data[i] for i in fresh], context, fresh)):
            if not isinstance(outcome, HandlerError):
                level = priority_level(self.door.priority(context, idx))
                outcome = level if isinstance(level, HandlerError) else \
                    Admission.make(self.engine, ids[idx], outcome, level)
            if isinstance(outcome, HandlerError):  # its own refusal: the others go on
                results[idx] = self.door.fail(context, idx, outcome)
            else:
                new.append((idx, outcome))
        try:
            if self.continuous:
                return self._one_step(context, ids, results, new, stats)
            return self._to_the_end(context, ids, results, new, stats)
        except Exception:  # a fault of ours in the model or the loop: every sequence ends now, each request a 500
            log.exception("generation step failed: releasing %d sequence(s)", len(self.live))
            return self._fail_all(context, ids, results)

    def _fail_all(self, context, ids: dict[int, str], results: list[Optional[bytes]]) -> list[bytes]:
        started = {key for key, count in self.answered.items() if count}
        self.engine.drop([seq.key for seq in self.engine.running])
        self.live.clear()
        self.answered.clear()
        self.admission.clear()
        fault = ServerFault("generation failed (the model log has the traceback)")
        more: list[Optional[bool]] = [None] * len(results)
        for idx, result in enumerate(results):
            if result is None:  # a request the checks had refused keeps its own answer
                results[idx] = self.door.fail(context, idx, fault)
                more[idx] = True if ids[idx] in started else None  # a started stream ends with the error
        context.stopping_criteria = [_More(value) for value in more] if self.continuous else None
        return results

    # ---- continuous batching: one step per call ----------------------------------------------
    def _one_step(self, context, ids, results, new, stats) -> list[bytes]:
        self.live.update((seq.key, seq) for _, seq in new)
        self.admission.wait(seq for _, seq in new)
        admitted = self.admission.admit(self.engine, self.admission.starting(self.engine.running))
        if admitted:  # their prefill is this call's work; the running ones advance at the next call
            stats.figures.first_tokens(admitted, lambda seq: seq.admitted_at)
        else:
            stats.figures.advanced(self.engine.step())
        more: list[Optional[bool]] = [None] * len(results)
        for idx, result in enumerate(results):
            if result is None:
                results[idx], more[idx] = self._answer(context, idx, self.live[ids[idx]])
        context.stopping_criteria = [_More(value) for value in more]
        stats.figures.waiting = len(self.waiting)
        stats.emit(self.door.metrics(context), self.engine)
        return results

    def _answer(self, context, idx: int, seq: Generation) -> tuple[bytes, Optional[bool]]:
        """This call's answer for one sequence, and whether more follows (see _More)."""
        first = self.answered.get(seq.key, 0) == 0
        self.answered[seq.key] = self.answered.get(seq.key, 0) + 1
        body = self._chunk(context, idx, seq)
        if not seq.done:
            return body, False
        self._forget(seq.key)
        return body, None if first else True

    def _chunk(self, context, idx: int, seq: Generation) -> bytes:
        request = seq.request
        context.set_response_content_type(idx, NDJSON if request.stream else JSON)
        if request.stream:
            piece = seq.text.take(final=seq.done)
            if not seq.done:
                return json_bytes({"text": piece}) + b"\n" if piece else b""
            return json_bytes({"text": piece, **_summary(seq)}) + b"\n"
        if not seq.done:
            return b""
        return json_bytes({"text": seq.text.take(final=True), **_summary(seq)})

    def _forget(self, key: str) -> None:
        self.live.pop(key, None)
        self.answered.pop(key, None)

    def _release_gone(self, present: set, stats: _CallStats) -> None:
        gone = [key for key in self.live if key not in present]
        for seq in self.engine.drop(gone):
            log.info("request %s left after %d tokens: its sequence is released", seq.key, seq.generated)
        for key in gone:
            self._forget(key)
        self.admission.leave(gone)
        stats.figures.released = len(gone)

    # ---- plain batching: the whole batch in one call ---------------------------------------
    def _to_the_end(self, context, ids, results, new, stats) -> list[bytes]:
        by_key = {seq.key: idx for idx, seq in new}
        streamed = {seq.key for _, seq in new if seq.request.stream}

        def on_step(moved: Sequence[Generation]) -> None:
            chunks = {}
            for seq in moved:
                if seq.key in streamed and not seq.done:
                    piece = seq.text.take(final=False)
                    if piece:
                        idx = by_key[seq.key]
                        context.set_response_content_type(idx, NDJSON)
                        chunks[idx] = json_bytes({"text": piece}) + b"\n"
            if chunks:
                self.door.stream(context, chunks)

        pending = Admission()  # every sequence of the batch, as the engine's KV budget makes room
        pending.waiting = [seq for _, seq in new]
        moved: list[Generation] = []
        while True:
            admitted = pending.admit(self.engine, pending.starting(self.engine.running))
            stats.figures.first_tokens(admitted, lambda seq: seq.admitted_at)
            on_step([*moved, *admitted])
            if not (self.engine.running or pending.waiting):
                break
            moved = self.engine.step()
            stats.figures.advanced(moved)
        for idx, seq in new:
            results[idx] = self._chunk(context, idx, seq)
        context.stopping_criteria = None
        stats.emit(self.door.metrics(context), self.engine)
        return results


def _summary(seq: Generation) -> dict:
    return {"finish_reason": seq.finish, "prompt_tokens": len(seq.request.prompt_ids),
            "generated_tokens": seq.generated}


class _CallStats:
    """What one call did; the service sums calls and reports at most once a second (metrics.py)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.figures = Figures()

    def emit(self, metrics, engine: Engine) -> None:
        """`metrics`: the engine adapter's MetricsSink for this call (None: nothing is reported)."""
        if metrics is None:
            return
        self.figures.running = len(engine.running)
        rate = _RATES.setdefault(self.model_name, TokenRate())
        emit(metrics, self.model_name, self.figures, engine, rate.add(self.figures.tokens))


_RATES: dict = {}  # model -> its tokens/s window (one service per worker process)
