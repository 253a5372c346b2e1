"""The engine at its own speed: one task per worker steps the continuous batch for as long as any
sequence runs, and requests join it as they arrive (TorchServe's asynchronous worker mode hands the
handler each request when it comes, instead of calling it once per decoding step).

    loop = EngineLoop(engine, max_running=0, on_stats=...)
    loop.ensure_running()                                  # on the worker's asyncio loop
    loop.submit(Ticket(key, request, priority, deliver))   # deliver(event) is called from the loop

The task runs on the asyncio loop's own thread, the worker's main thread, one step at a time,
yielding to the loop between steps (which is when arrivals are taken and new text is sent). Torch
from a second thread of the worker ran this model's steps at under half their speed with two
intra-op threads, and a second thread contends for the GIL with the sends
([optimisations](../../docs/optimisations.md#the-generation-engine)).

Each iteration admits what arrived (a prefill; the new sequences get their first token), then
advances every running sequence by one token (or several, speculating), then hands each sequence's
new text to its ticket. A fault of the model or the loop fails only the requests it held, each with
a 5xx; the loop goes on with the next arrivals. Priorities and `max_running` work as in the
step-per-call mode (serving.py), through the same policy (admission.py).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional, Union

from handlers.errors import HandlerError, ServerFault
from handlers.generation.admission import Admission
from handlers.generation.engine import Engine, Generation
from handlers.generation.metrics import Figures
from handlers.generation.params import GenerationRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chunk:
    """New text of a sequence (possibly empty: a token that completes no character yet), and its
    token counts so far."""

    text: str
    prompt_tokens: int = 0
    generated_tokens: int = 0


@dataclass(frozen=True)
class Done:
    """The sequence ended: its last text, and why."""

    text: str
    finish: str
    prompt_tokens: int
    generated_tokens: int


@dataclass(frozen=True)
class Failed:
    error: HandlerError


Event = Union[Chunk, Done, Failed]


@dataclass
class Ticket:
    """One request in the loop: what to generate, and where its events go (called on the asyncio loop)."""

    key: str
    request: GenerationRequest
    deliver: Callable[[Event], None]
    priority: int = 1  # 0 high, 1 normal, 2 low
    arrived: float = field(default_factory=time.perf_counter)


LoopStats = Figures  # what the loop did since its last report (metrics.py)

IDLE_WAIT_MIN_S = 0.05  # an idle loop wakes at most this often, whatever stats_every_s asks


class EngineLoop:
    def __init__(self, engine: Engine, max_running: int = 0, on_stats: Optional[Callable[[Figures], None]] = None,
                 stats_every_s: float = 1.0, after_step: Callable[[], None] = lambda: None) -> None:
        """`after_step`: called once a step's (or a prefill's) events are delivered, to send what they
        made at once."""
        self.engine = engine
        self.after_step = after_step
        self.admission = Admission(max_running)
        self.on_stats = on_stats
        self.stats_every_s = stats_every_s
        self._inbox: collections.deque[tuple[str, object]] = collections.deque()
        self._tickets: dict[str, Ticket] = {}
        self._stats = Figures()
        self._reported = time.perf_counter()
        self._stopped = False
        self._task: Optional[asyncio.Task] = None
        self._arrived: Optional[asyncio.Event] = None

    def ensure_running(self) -> None:
        """Start the loop's task on the running asyncio loop unless it already runs there."""
        if self._task is not None and not self._task.done() and self._task.get_loop() is asyncio.get_running_loop():
            return
        self._stopped = False
        self._arrived = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-loop")

    def submit(self, ticket: Ticket) -> None:
        self._put(("submit", ticket))

    def stop(self) -> None:
        """End the loop's task (the requests it still holds are dropped unanswered)."""
        self._stopped = True
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def cancel(self, key: str) -> None:
        """Release the request's sequence at the next step (its client is gone)."""
        self._put(("cancel", key))

    def _put(self, item: tuple[str, object]) -> None:
        self._inbox.append(item)
        if self._arrived is not None:
            self._arrived.set()

    # ---- the loop ----------------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopped:
            if not self.engine.running and not self.admission.waiting and not self._inbox:
                self._arrived.clear()
                try:  # idle: wait for a request, reporting the (idle) gauges meanwhile
                    await asyncio.wait_for(self._arrived.wait(), timeout=max(self.stats_every_s, IDLE_WAIT_MIN_S))
                except TimeoutError:
                    self._report()
                    continue
            try:
                self.iterate()
            except Exception:  # never a silent end of the task: what it held fails, the next arrivals run
                log.exception("the engine loop failed: failing %d request(s)", len(self._tickets))
                self.admission.clear()
                self._fail(list(self._tickets), ServerFault("generation failed (the model log has the traceback)"))
            # Two turns of the asyncio loop before the next step: a request that arrived during this
            # step becomes a task in the first turn and submits itself in the second (one turn would
            # leave it for the step after next).
            await asyncio.sleep(0)
            await asyncio.sleep(0)

    def iterate(self) -> None:
        """Admit what arrived, advance every running sequence one step, hand out the new text."""
        self._take_arrived()
        if self._stopped:
            return
        starting = self.admission.starting(self.engine.running)
        try:
            admitted = self.admission.admit(self.engine, starting)
            if admitted:
                self._stats.first_tokens(admitted, lambda seq: self._tickets[seq.key].arrived)
                self._deliver(admitted)
                self.after_step()  # their first tokens go out now, not after the step below
            moved = self.engine.step() if self.engine.running else []
            self._stats.steps += bool(moved)
            self._stats.peak_running = max(self._stats.peak_running, len(moved))
            self._stats.advanced(moved)
            self._deliver(moved)  # a sequence admitted above may end in this same step: its end goes out too
            self.after_step()
        except Exception:  # a fault of ours: the requests the loop holds get a 5xx, the loop goes on
            log.exception("generation step failed: failing %d sequence(s)", len(self.engine.running))
            self._fail([seq.key for seq in (*starting, *self.engine.running)],
                       ServerFault("generation failed (the model log has the traceback)"))
        self._report()

    def _take(self, item: tuple[str, object]) -> None:
        kind, value = item
        if kind == "submit":
            ticket = value
            seq = self.admission.make(self.engine, ticket.key, ticket.request, ticket.priority)
            if isinstance(seq, HandlerError):  # its own refusal; the loop goes on
                ticket.deliver(Failed(seq))
                return
            self._tickets[ticket.key] = ticket
            self.admission.wait([seq])
        elif kind == "cancel":
            self.admission.leave([value])
            for seq in self.engine.drop([value]):
                log.info("request %s left after %d tokens: its sequence is released", seq.key, seq.generated)
            self._tickets.pop(value, None)

    def _take_arrived(self) -> None:
        while self._inbox:
            self._take(self._inbox.popleft())

    def _deliver(self, sequences: list[Generation]) -> None:
        for seq in sequences:
            ticket = self._tickets.get(seq.key)
            if ticket is None:
                continue
            if seq.done:
                del self._tickets[seq.key]
                ticket.deliver(Done(seq.text.take(final=True), seq.finish, len(seq.request.prompt_ids),
                                    seq.generated))
            else:
                ticket.deliver(Chunk(seq.text.take(final=False), len(seq.request.prompt_ids), seq.generated))

    def _fail(self, held: list[str], error: HandlerError) -> None:
        keys = list(dict.fromkeys(held))
        self.admission.leave(keys)  # one the engine had deferred back to the waiting room included
        self.engine.drop(keys)
        self.engine.running, self.engine.kv = [], None  # whatever state the fault left is not trusted
        for key in keys:
            ticket = self._tickets.pop(key, None)
            if ticket is not None:
                ticket.deliver(Failed(error))

    def _report(self) -> None:
        now = time.perf_counter()
        if self.on_stats is None or now - self._reported < self.stats_every_s:
            return
        self._stats.running, self._stats.waiting = len(self.engine.running), len(self.admission.waiting)
        stats, self._stats, self._reported = self._stats, Figures(), now
        try:
            self.on_stats(stats)
        except Exception:  # metrics must never stop generation
            log.exception("reporting generation metrics failed")
