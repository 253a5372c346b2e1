"""Batching in the worker, for the request/response families (`runtime.batching: worker`).

The archive runs in TorchServe's asynchronous mode (`asyncCommunication: true`, handlers/async_handler.py):
the frontend forwards each request as it arrives and ts/async_service.py awaits `handle` for it on an
asyncio loop. Each request waits here with its own context and future. A batch closes when it holds
`runtime.worker_batch_size` requests, or `runtime.batch_window_ms` after its first one arrived (a
batch whose first request waited out a running batch closes at once, with what queued meanwhile).

It then goes through the handler's own request loop in two stages (Handler.prepare: refusals, cache,
deadlines, decode, collate; Handler.complete: the model, post-processing, answers, metrics), each on
its own thread so that the event loop keeps receiving: while one batch is in the model, the next is
decoded. At most one prepared batch waits behind the one in the model, so requests arriving meanwhile
form the batch after it. A bad request gets its own 4xx from the request loop, its batch-mates their
answers; a fault of the whole batch (the model raising) fails that batch's requests alone, through
TorchServe's error answer, and the worker serves on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

from handlers.batch_context import BatchContext
from handlers.deadlines import Arrival
from handlers.errors import ConfigError
from handlers.prepared import Prepared
from handlers.settings import ASYNC_ENTRY, RuntimeSettings

log = logging.getLogger(__name__)


def max_batch(runtime: RuntimeSettings, model_config: dict, frontend_batch: int, generates: bool, model_name: str) -> int:
    """The most requests one of this worker's batches holds (its warm-up covers each size up to it).
    Refuses an archive whose TorchServe mode does not match its batching."""
    asynchronous = bool(model_config.get("asyncCommunication", False))
    if runtime.batching == "frontend":
        if asynchronous and not generates:
            raise ConfigError(f"{model_name}: asyncCommunication: true forwards requests one by one: a request/response "
                              "family batches them with runtime.batching: worker (the build writes both)")
        return frontend_batch
    if not asynchronous:
        raise ConfigError(f"{model_name}: runtime.batching: worker needs asyncCommunication: true in model-config.yaml "
                          f"and {ASYNC_ENTRY} as the handler (the build writes both: rebuild the archive)")
    if frontend_batch > 1:
        log.warning("%s: batchSize %d: with worker batching the frontend should forward each request at once "
                    "(batchSize 1); the worker batches up to runtime.worker_batch_size (%d)",
                    model_name, frontend_batch, runtime.worker_batch_size)
    return runtime.worker_batch_size


@dataclass
class Waiting:
    """One request waiting for a batch."""

    body: Any
    context: Any  # the context its message came with
    idx: int  # its index in that context
    arrival: Arrival
    answer: asyncio.Future


class WorkerBatcher:
    def __init__(self, prepare: Callable[[list, Any, list], Prepared], complete: Callable[[Prepared], list],
                 max_batch_size: int, window_ms: int, model_name: str = "") -> None:
        """`prepare(bodies, context, arrivals)` and `complete(prepared)`: the handler's two stages."""
        self.prepare = prepare
        self.complete = complete
        self.max_batch_size = max_batch_size
        self.window_s = window_ms / 1000.0
        self.model_name = model_name
        self.waiting: deque[Waiting] = deque()
        self.arrived: Optional[asyncio.Event] = None  # made on the worker's event loop, at the first request
        self.runner: Optional[asyncio.Task] = None
        # One thread decodes, one runs the model: decoding overlaps inference, the event loop stays free.
        self.decoder = ThreadPoolExecutor(1, thread_name_prefix="batch-prepare")
        self.inference = ThreadPoolExecutor(1, thread_name_prefix="batch-infer")

    async def handle(self, data: list[Any], context) -> list[Any]:
        """One message's requests (TorchServe's async worker: usually one), answered once each batch
        holding them has run."""
        if self.runner is None or self.runner.done():
            self.arrived = asyncio.Event()
            self.runner = asyncio.get_running_loop().create_task(self._run())
        loop = asyncio.get_running_loop()
        arrival = Arrival.now()
        mine = [Waiting(body, context, idx, arrival, loop.create_future()) for idx, body in enumerate(data)]
        self.waiting.extend(mine)
        self.arrived.set()
        return list(await asyncio.gather(*(w.answer for w in mine)))

    def close(self) -> None:
        """Stop the threads (tests; a worker process ends with them)."""
        if self.runner is not None:
            self.runner.cancel()
        self.decoder.shutdown(wait=False, cancel_futures=True)
        self.inference.shutdown(wait=False, cancel_futures=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        running: Optional[asyncio.Future] = None  # the batch in the model
        while True:
            batch = await self._next_batch()
            try:
                prepared = await loop.run_in_executor(self.decoder, self._prepare, batch)
            except Exception as err:  # a fault outside the request loop's per-request checks: this batch fails alone
                log.exception("%s: preparing a batch of %d failed", self.model_name, len(batch))
                _fail(batch, err)
                continue
            if running is not None:
                await asyncio.wait([running])  # one batch in the model, this one ready behind it
            running = loop.run_in_executor(self.inference, self.complete, prepared)
            running.add_done_callback(functools.partial(self._answer, batch))

    async def _next_batch(self) -> list[Waiting]:
        while not self.waiting:
            self.arrived.clear()
            await self.arrived.wait()
        closes = self.waiting[0].arrival.monotonic + self.window_s
        while len(self.waiting) < self.max_batch_size:
            left = closes - time.monotonic()
            if left <= 0:
                break
            self.arrived.clear()
            try:  # waiting on the event, not on a queue: a timeout loses no request
                await asyncio.wait_for(self.arrived.wait(), left)
            except TimeoutError:
                break
        return [self.waiting.popleft() for _ in range(min(self.max_batch_size, len(self.waiting)))]

    def _prepare(self, batch: list[Waiting]) -> Prepared:
        context = BatchContext([(w.context, w.idx) for w in batch])
        return self.prepare([w.body for w in batch], context, [w.arrival for w in batch])

    def _answer(self, batch: list[Waiting], done: asyncio.Future) -> None:
        if done.cancelled():  # closed while the batch waited for the model
            for waiting in batch:
                waiting.answer.cancel()
            return
        err = done.exception()
        if err is not None:
            log.error("%s: a batch of %d failed in the model", self.model_name, len(batch), exc_info=err)
            _fail(batch, err)
            return
        for waiting, result in zip(batch, done.result()):
            if not waiting.answer.done():
                waiting.answer.set_result(result)


def _fail(batch: list[Waiting], err: BaseException) -> None:
    for waiting in batch:
        if not waiting.answer.done():
            waiting.answer.set_exception(err)
