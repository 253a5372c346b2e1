"""Which waiting sequences join the running batch: one policy for both continuous-batching loops, a
step per call (serving.py) and the async engine loop (engine_loop.py).

A request enters with its priority (`X-Priority: high | normal | low`, default normal). A header that
is none of these is the request's own 400 (`priority_level`), and a sequence the engine will not
make is its own refusal (`Admission.make`: the engine's error, a 507 for a request over the KV-cache
budget alone, or a 500 for a fault of ours): a request is refused, never dropped. A sequence that was
made waits here, high first, then normal, then low, each in order of arrival. At each iteration
`starting` takes every high-priority sequence, and others while fewer than `max_running` (0: no
limit) normal and low sequences run; `admit` prefills them, and those the engine defers (no room in
its KV-cache budget) wait again at the head of their class. The loop answers every sequence admitted,
one that its prefill already finished included.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Union

from handlers.errors import BadInput, HandlerError, ServerFault
from handlers.generation.engine import Generation
from handlers.generation.params import GenerationRequest

log = logging.getLogger(__name__)

PRIORITIES = {"high": 0, "normal": 1, "low": 2}
HIGH, NORMAL = PRIORITIES["high"], PRIORITIES["normal"]


def priority_level(header: Union[str, None]) -> Union[int, HandlerError]:
    """The level an `X-Priority` header asks for (normal when absent), or the 400 naming it."""
    if header is None:
        return NORMAL
    level = PRIORITIES.get(header.strip().lower())
    if level is None:
        return BadInput(f"X-Priority: {header[:40]!r} is not one of high, normal, low")
    return level


class Admission:
    """The waiting room of one continuous batch. `engine`: anything with `new_sequence(key, request)`."""

    def __init__(self, max_running: int = 0) -> None:
        self.max_running = max_running
        self.waiting: list[Generation] = []  # by priority, then arrival

    @staticmethod
    def make(engine: Any, key: str, request: GenerationRequest, priority: int) -> Union[Generation, HandlerError]:
        """The request's sequence, or the error refusing it alone: the engine's own (a request over
        the KV-cache budget), else a 500 (a fault of ours with this request)."""
        try:
            seq = engine.new_sequence(key, request)
        except HandlerError as err:
            return err
        except Exception:  # the batch and the other requests go on
            log.exception("request %s could not join the batch", key)
            return ServerFault("generation failed (the model log has the traceback)")
        seq.priority = priority
        return seq

    def wait(self, sequences: Iterable[Generation]) -> None:
        self.waiting.extend(sequences)
        self.waiting.sort(key=lambda seq: seq.priority)  # stable: arrival order within a class

    def starting(self, running: Sequence[Generation]) -> list[Generation]:
        """The waiting sequences that start now (they leave the room): every high-priority one, and
        others while fewer than max_running non-high sequences run."""
        room = float("inf") if self.max_running == 0 else \
            self.max_running - sum(1 for seq in running if seq.priority != HIGH)
        starting, still = [], []
        for seq in self.waiting:
            if seq.priority == HIGH or room > 0:
                starting.append(seq)
                room -= seq.priority != HIGH
            else:
                still.append(seq)
        self.waiting = still
        return starting

    def admit(self, engine: Any, starting: Sequence[Generation]) -> list[Generation]:
        """Prefill `starting` (from `starting()`); returns those admitted. The ones the engine defers
        for room wait again, ahead of the others of their class."""
        if not starting:
            return []
        deferred = engine.admit(starting) or []
        if deferred:
            self.waiting[:0] = deferred
            self.waiting.sort(key=lambda seq: seq.priority)
        return list(starting[:len(starting) - len(deferred)])

    def leave(self, keys: Iterable[str]) -> None:
        """These requests' sequences stop waiting (their clients are gone)."""
        gone = set(keys)
        if gone:
            self.waiting = [seq for seq in self.waiting if seq.key not in gone]

    def clear(self) -> None:
        self.waiting = []
