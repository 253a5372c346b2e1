"""The request loop of a request/response family, one batch at a time, over the batch's `Request`
records (handlers/request.py): refusals at the door, cached answers (handlers/repeats.py), deadlines
(handlers/deadlines.py), each request unwrapped by its protocol (handlers/protocols/) and decoded by
the family, then collate -> infer -> postprocess -> each request's answer wrapped by its protocol.

Each request is validated on its own: a bad one gets its own 4xx and its batch-mates are answered
normally; an error no check foresaw is that request's 500, logged with its traceback, and a batch that
fails in the model is computed again request by request, so that only the request that fails alone
gets its 500. A request whose deadline has passed gets its 504 without being computed. Two stages:
`prepare` (up to the collated batch) and `complete` (the model onwards). Nothing here knows the engine:
the handler's adapter turned the batch into records and writes the replies back.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

import numpy as np

from handlers import device
from handlers.deadlines import BEFORE_DECODE, BEFORE_INFERENCE
from handlers.errors import HandlerError, OutOfMemory, ServerFault
from handlers.prepared import Job, Prepared
from handlers.profiling import region
from handlers.protocols import Reply
from handlers.repeats import follow, leave
from handlers.request import Request
from handlers.stage_metrics import StageClock, TracedClock, attribute_gpu_time, emit, emit_deadlines

log = logging.getLogger(__name__)


class BatchLoop:
    """The loop's stages, mixed into the Handler (which holds the family, the model and the policies)."""

    def prepare(self, requests: list[Request]) -> Prepared:
        """The request loop's first stage: refusals, cached answers, deadlines, decoding and collating."""
        tracer = self.tracing  # off: this check and a no-op clock.mark are all that tracing costs a batch
        jobs = [Job(request, self.protocols[request.route]) for request in requests]
        batch = Prepared(jobs, StageClock() if tracer is None else TracedClock())
        clock = batch.clock
        for job in jobs:
            if job.request.error is not None:  # a malformed deadline header, a body in several form fields
                job.refuse(job.request.error)
        todo = [job for job in jobs if job.error is None]
        if self.batch_cache is not None:
            todo = self.batch_cache.lookup(todo, (self.version, self.settings.variant))
        # A cached answer costs nothing and goes out whatever its deadline; the rest need time for a batch.
        todo = self._expire(batch, todo, BEFORE_DECODE)

        started = clock.start()
        with region(self.profiler, "preprocess"):
            self._decode(todo)
            # Decoding the batch may have used up a request's budget: it leaves the batch uncomputed.
            for job in self._expire(batch, [job for job in todo if job.error is None], BEFORE_INFERENCE):
                job.first, job.computed = len(batch.decoded), True
                batch.computing.append(job)
                batch.decoded.extend(job.items)
            clock.mark("decoded")
            batch.inputs = self.family.collate(batch.decoded) if batch.decoded else None
        clock.stop("preprocess", started)
        return batch

    def _expire(self, batch: Prepared, leaders: list[Job], stage: str) -> list[Job]:
        """The requests among `leaders` (and their repeats) still in time at this stage; the others get
        their 504. A repeat whose leader left takes its place (and its decoded items)."""
        members = [job for job in batch.jobs if job.leader is not None]
        expired = batch.deadlines.expire([(job, job.request.due) for job in [*leaders, *members]], stage,
                                         self.service_time)
        if not expired:
            return leaders
        for job, err in expired:
            job.refuse(err)
        gone = [job for job, _ in expired]
        moved = leave(batch.jobs, gone)
        for old, new in moved.items():
            new.unwrapped, new.items = old.unwrapped, old.items
        return follow(leaders, moved, gone)

    def _decode(self, jobs: list[Job]) -> None:
        """Each request unwrapped by its protocol and its items decoded by the family, or refused alone."""
        for job in jobs:
            try:
                job.unwrapped = job.protocol.unwrap(job.request)
                job.protocol = job.unwrapped.protocol
            except HandlerError as err:
                job.refuse(err)
            except Exception:  # a fault of ours no check foresaw: this request's 500, the batch goes on
                job.refuse(decode_fault(job.request.index))
        pending = [job for job in jobs if job.error is None]
        work = [(job.request.index, body, media_type) for job in pending if job.unwrapped.decoded is None
                for body, media_type in job.unwrapped.bodies]
        if self.decode_pool is None or len(work) <= 1:
            decoded = [self._decode_one(item) for item in work]
        else:  # image decoding and resizing release the GIL: a batch decodes on several cores at once
            decoded = list(self.decode_pool.map(self._decode_one, work))
        at = 0
        for job in pending:
            if job.unwrapped.decoded is not None:
                job.items = list(job.unwrapped.decoded)
                continue
            count = len(job.unwrapped.bodies)
            mine, at = decoded[at:at + count], at + count
            failed = next(((i, d) for i, d in enumerate(mine) if isinstance(d, HandlerError)), None)
            if failed is None:
                job.items = mine
            else:  # one bad instance rejects its whole request, naming the instance
                job.refuse(job.protocol.instance_error(failed[1], failed[0]))

    def _decode_one(self, work: tuple[int, Any, str]) -> Any:
        idx, body, media_type = work
        try:
            return self.family.decode(body, media_type)
        except HandlerError as err:
            return err
        except Exception:  # as above
            return decode_fault(idx)

    def complete(self, batch: Prepared, metrics: Any = None) -> list[Optional[Reply]]:
        """The request loop's second stage: the forward pass, post-processing, the answers, the cache,
        the counters (`metrics`: the engine's sink for this batch)."""
        clock = batch.clock
        if batch.items:
            started = clock.start()
            try:
                with region(self.profiler, "inference"), device.GpuTimer(self.device) as gpu:
                    outputs = self.infer(batch.inputs)
                clock.stop("inference", started)
                started = clock.start()
                with region(self.profiler, "postprocess"):
                    answers = self.family.postprocess(outputs, batch.inputs)
                    tokens = self._tokens(batch.computing, batch.inputs)
                    for job in batch.computing:
                        if job.items:
                            end = job.first + len(job.items)
                            self._answer(job, answers[job.first:end], tokens and tokens[job.first:end])
                clock.stop("postprocess", started)
                attribute_gpu_time(clock, gpu.elapsed_ms())
            except OutOfMemory as err:  # the GPU ran out on this batch: its 507; later ones run in pieces
                for job in (job for job in batch.computing if job.items):
                    job.refuse(err)
                clock.stop("inference", started)
            except Exception:  # one request's items made the batch fail: each request again, on its own
                log.exception("a batch of %d request(s) failed: computing each on its own", len(batch.computing))
                self._one_by_one(batch)
                clock.stop("inference", started)

        for job in batch.computing:  # a request without items (OpenAI's models list) is answered as it is
            if not job.items:
                self._answer(job, [], None)
        if self.batch_cache is not None:
            self.batch_cache.remember(batch.jobs, metrics)
        batch.deadlines.count_late(job.request.due for job in batch.computing)
        if batch.items:
            self.service_time.update(clock.elapsed_ms)
        emit(metrics, self.model_name, clock, batch.items, self.gpu_gauges.read())
        emit_deadlines(metrics, self.model_name, batch.deadlines)
        if self.tracing is not None:
            self.tracing.record_batch(batch.jobs, clock, batch.items)
        if self.profiler is not None:
            self.profiler.step()
        return [job.reply for job in batch.jobs]

    def _tokens(self, jobs: list[Job], inputs: Any) -> Optional[list[int]]:
        """Each item's token count, from the collated batch, when a request's protocol reports usage."""
        if not any(job.protocol.wants_tokens and job.items for job in jobs):
            return None
        return self.family.item_tokens(inputs)

    def _one_by_one(self, batch: Prepared) -> None:
        """Each request's items as a batch of their own: a request that fails alone gets its 500."""
        for job in batch.computing:
            if not job.items:
                continue
            try:
                inputs = self.family.collate(job.items)
                answers = self.family.postprocess(self.infer(inputs), inputs)
                self._answer(job, answers, self._tokens([job], inputs))
            except Exception:  # a fault of ours no check foresaw, with this request alone
                log.exception("request %d failed on its own", job.request.index)
                job.refuse(ServerFault("the model failed on this request (the model log has the traceback)"))

    def _answer(self, job: Job, answers: list[Any], tokens: Optional[list[int]]) -> None:
        """One request's answer wrapped by its protocol, or its 500 when the answer cannot be right."""
        if not all_finite(answers):
            job.refuse(ServerFault("the model's answer holds NaN or infinity"))
            return
        try:
            job.reply = job.protocol.wrap(job.unwrapped, answers, tokens)
        except Exception:  # a fault of ours in wrapping: this request's 500, its batch-mates answered
            log.exception("unexpected error wrapping the answer of request %d", job.request.index)
            job.refuse(ServerFault("unexpected error wrapping the answer (the model log has the traceback)"))


def decode_fault(idx: int) -> ServerFault:
    log.exception("unexpected error decoding request %d", idx)
    return ServerFault("unexpected error decoding the request (the model log has the traceback)")


def all_finite(value: Any) -> bool:
    """No NaN or infinity anywhere in an answer (JSON has neither: the encoder would write null)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, np.ndarray):
            if item.dtype.kind in "fc" and not np.isfinite(item).all():
                return False
            if item.dtype == object:
                stack.extend(item.ravel().tolist())
        elif isinstance(item, np.floating):
            if not np.isfinite(item):
                return False
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return True
