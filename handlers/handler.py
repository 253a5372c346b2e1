"""The handler TorchServe runs for every archive: the request loop, whatever the model.

settings -> runtime (threads, precision, graph) -> per-request decode -> batched infer -> post.
The family named in the archive's settings (handlers/families/) supplies what depends on the
model's inputs and outputs. Each request is validated on its own: a bad one gets its own 4xx
(handlers/answers.py writes every status) and its batch-mates are answered normally; an error no
check foresaw is that request's 500, logged with its traceback, and a batch that fails in the model
is computed again request by request, so that only the request that fails alone gets its 500. A request
whose deadline (handlers/deadlines.py) has passed gets its 504 without being computed. A KServe
v1 / Open Inference Protocol v2 request (handlers/kserve.py) adds one item per instance to the
batch's forward pass and is answered in its own protocol. The loop is two stages, `prepare` (up to
the collated batch) and `complete` (the model onwards).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Optional

import torch

from handlers import device, kserve, runtime, self_check, tracing
from handlers.answers import all_finite, close_replies, encode_answer, reject
from handlers.deadlines import BEFORE_DECODE, BEFORE_INFERENCE, ServiceTime
from handlers.deadlines import read as read_deadlines
from handlers.errors import ConfigError, HandlerError, ServerFault
from handlers.families import Family, family_class
from handlers.onnx_session import OnnxModule, load_onnx
from handlers.openai import envelope as openai_envelope
from handlers.openai import routes
from handlers.openai.errors import OpenAIError
from handlers.prepared import Prepared
from handlers.profiling import make_profiler, region
from handlers.repeats import BatchCache, follow
from handlers.request_parts import content_type, request_body, request_headers
from handlers.response_cache import ResponseCache
from handlers.settings import SERIALISED_GRAPHS, HandlerSettings
from handlers.stage_metrics import StageClock, TracedClock, attribute_gpu_time, emit, emit_deadlines
from handlers.worker_threads import worker_threads

log = logging.getLogger(__name__)

class Handler:
    """TorchServe instantiates this once per worker."""

    def __init__(self):
        self.initialized = False
        self.settings: Optional[HandlerSettings] = None
        self.family: Optional[Family] = None
        self.model = None
        self.profiler = None
        self.decode_pool = None
        self.generation = None  # a generative family's service (handlers/generation/serving.py)
        self.batch_cache = None  # handlers/repeats.py over a response cache, when the archive's settings turn it on
        self.service_time = ServiceTime()  # what a request's remaining budget must cover (handlers/deadlines.py)
        self.tracing = None  # handlers/tracing.py, when the environment or the archive's settings turn it on
        self.gpu_gauges = device.GpuGauges(torch.device("cpu"))  # on a GPU: its memory and utilisation per batch

    # ---- lifecycle -------------------------------------------------------------------------
    def initialize(self, context) -> None:
        started = time.perf_counter()
        props = context.system_properties
        model_dir = Path(props["model_dir"])
        self.model_name = context.model_name
        self.metrics_context = context  # what a generating worker's engine loop reports through
        self.loaded_at = int(time.time())  # OpenAI's models list: `created`
        yaml_config = getattr(context, "model_yaml_config", None) or {}
        self.settings = HandlerSettings.from_mapping(yaml_config.get("handler"))
        rt = self.settings.runtime
        self.placement = device.place(props.get("gpu_id"), rt.device)
        self.device = self.placement.device
        self.gpu_gauges = device.GpuGauges(self.device)
        device.emit_placement(getattr(context, "metrics", None), self.model_name, self.placement)
        self.max_batch_size = int(props.get("batch_size") or 1)
        workers = runtime.sibling_worker_count()
        own = yaml_config.get("minWorkers")
        self.threads, threads_from = worker_threads(rt, self.model_name, _model_version(context),
                                                    own if isinstance(own, int) else None)
        runtime.apply_threads(self.threads, rt.interop_threads)
        runtime.configure_cuda(rt, self.device)
        # TorchScript archives were traced under their precision: the casts are already in the graph;
        # an ONNX graph runs in ONNX Runtime, outside torch's autocast.
        self.autocast_dtype = (
            None if rt.graph in SERIALISED_GRAPHS else runtime.resolve_precision(rt.precision, self.device)
        )
        self.family = family_class(self.settings.family)(self.settings.family_settings, model_dir, rt.channels_last)
        self.decode_pool = runtime.decode_pool(rt.preprocess_threads or self.threads)
        self.model = self.load_model(model_dir)
        if self.family.generates:
            continuous = bool(yaml_config.get("continuousBatching", False))
            asynchronous = bool(yaml_config.get("asyncCommunication", False))
            if continuous and workers > 1:
                # TorchServe 0.12's Model.pollInferJob holds the model's queue lock while an idle worker
                # waits for a request, and a continuous batch takes that lock every step: a second
                # worker stalls the first one's running sequences until new traffic comes.
                raise ConfigError(f"{self.model_name}: continuous batching runs on one worker per model in "
                                  f"TorchServe 0.12 ({workers} started): set minWorkers=maxWorkers=1 and raise "
                                  "batchSize (sequences per step) instead")
            from handlers.generation.wiring import generation_service  # the generative families' stack only

            self.generation = generation_service(self, model_dir, continuous, asynchronous)
        if self.family.generates and rt.deadline_ms:
            raise ConfigError("runtime.deadline_ms: deadlines apply to request/response families only (remove it)")
        if self.settings.response_cache.enabled:
            if self.family.generates:
                raise ConfigError("response_cache: not available for generating families yet (remove the section)")
            self.batch_cache = BatchCache(ResponseCache(self.settings.response_cache), self.model_name)
        self.version = _model_version(context)
        if not self.family.generates:  # generation answers step by step, outside the stage clock
            self.tracing = tracing.make_tracing(tracing.TracingConfig.from_settings(rt.tracing, os.environ),
                                                self.model_name, self.version)
        # On a GPU a batch is padded up to a bucket: cudnn's autotuning and the warm-up see those shapes only.
        self.buckets = device.batch_buckets(self.max_batch_size)
        self_check.verify(model_dir, self.model_name, self.settings.variant, self.family, self.infer)  # or refuse to load
        if rt.cuda_graphs and self.device.type == "cuda" and not self.family.generates:
            from handlers.cuda_graphs import GraphedBuckets  # GPU workers only

            self.model = GraphedBuckets(self.model, self.device, self.autocast_dtype)
        if rt.warmup:
            warm = self.generation.warm_up if self.generation else lambda size: self.infer(self.family.example_batch(size))
            runtime.warm_up(warm, self.buckets)
        if hasattr(self.model, "seal"):
            self.model.seal()
        self.profiler = make_profiler(self.settings.profiler, self.model_name, self.device.type == "cuda")
        runtime.drop_per_batch_log_line()
        frozen = runtime.freeze_heap() if rt.freeze_heap else 0
        self.initialized = True
        log.info(
            "%s ready in %.1fs: family=%s variant=%s device=%s (%s) threads=%d (from %s; workers=%d) precision=%s "
            "graph=%s max_batch=%d frozen_objects=%d%s",
            self.model_name, time.perf_counter() - started, self.settings.family,
            self.settings.variant or "-", self.device, self.placement.reason, self.threads,
            threads_from, workers, runtime.precision_label(rt, self.autocast_dtype), rt.graph, self.max_batch_size, frozen,
            runtime.session_label(self.model),
        )

    def load_model(self, model_dir: Path):
        rt = self.settings.runtime
        weights = model_dir / self.settings.weights
        if rt.graph == "torchscript":
            module = device.load_torchscript(str(weights), self.device)
            return torch.jit.optimize_for_inference(module) if rt.optimize_for_inference else module
        if rt.graph == "onnx":
            return load_onnx(weights, self.threads, device.check_onnx_provider(self.device))
        model = self.family.wrap(self.settings.source.build(model_dir))
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        model = runtime.prepare_eager(model, self.device, rt.channels_last)
        if rt.graph == "compile":
            return runtime.compile_model(model, rt.compile_mode)
        return model

    # ---- the request loop ------------------------------------------------------------------
    def handle(self, data: Optional[list[Any]], context) -> Optional[list[Any]]:
        if data is None:
            return None
        if self.generation is not None:
            with region(self.profiler, "generation_step"):
                answers = self.generation.handle(data, context)
            if self.profiler is not None:
                self.profiler.step()  # one decoding step (continuous batching) or one whole batch
        else:
            answers = self.complete(self.prepare(data, context))
        close_replies(context, len(data))
        return answers

    def prepare(self, data: list[Any], context) -> Prepared:
        """The request loop's first stage: refusals, cached answers, deadlines, decoding and collating."""
        tracer = self.tracing  # off: this check and a no-op clock.mark are all that tracing costs a batch
        batch = Prepared(context, len(data), StageClock() if tracer is None else TracedClock(), [None] * len(data))
        clock, refused = batch.clock, batch.refused
        batch.deadlines, malformed = read_deadlines(lambda idx: request_headers(context, idx), len(data),
                                                    self.settings.runtime.deadline_ms)
        self._refuse(batch, malformed)
        todo = [i for i in range(len(data)) if i not in refused]
        if self.batch_cache is not None:
            batch.repeats, todo = self.batch_cache.lookup(
                (self.version, self.settings.variant), todo, lambda idx: self._cache_key(data, context, idx),
                context, batch.results, lambda idx, err: self._refuse(batch, {idx: err}))
        # A cached answer costs nothing and goes out whatever its deadline; the rest need time for a batch.
        todo = self._expire(batch, todo, BEFORE_DECODE)
        items: list[Any] = []

        started = clock.start()
        with region(self.profiler, "preprocess"):
            accepted = {}
            for idx, outcome in zip(todo, self.decode_all(data, context, todo)):
                if isinstance(outcome, HandlerError):
                    self._refuse(batch, {idx: outcome})
                else:
                    accepted[idx] = outcome
            # Decoding the batch may have used up a request's budget: it leaves the batch uncomputed.
            for idx in self._expire(batch, list(accepted), BEFORE_INFERENCE, accepted):
                envelope, decoded = accepted[idx]
                batch.spans.append((idx, envelope, len(items), len(decoded)))
                items.extend(decoded)
            clock.mark("decoded")
            batch.items, batch.decoded = len(items), items
            batch.inputs = self.family.collate(items) if items else None
        clock.stop("preprocess", started)
        return batch

    def _expire(self, batch: Prepared, todo: list[int], stage: str, decoded: Optional[dict] = None) -> list[int]:
        """The requests among `todo` (and their repeats) still in time at this stage; the others get
        their 504. A repeat whose representative left takes its place (and its decoded items)."""
        expired = batch.deadlines.expire([*todo, *batch.repeats.members()], stage, self.service_time)
        self._refuse(batch, expired)
        moved = batch.repeats.leave(expired)
        for old, new in moved.items():
            if decoded is not None and old in decoded:
                decoded[new] = decoded.pop(old)
        return follow(todo, moved, expired)

    def complete(self, batch: Prepared) -> list[Optional[bytes]]:
        """The request loop's second stage: the forward pass, post-processing, the answers' bytes, the
        cache, the counters."""
        context, clock, results, spans = batch.context, batch.clock, batch.results, batch.spans
        if batch.items:
            started = clock.start()
            try:
                with region(self.profiler, "inference"), device.GpuTimer(self.device) as gpu:
                    outputs = self.infer(batch.inputs)
                clock.stop("inference", started)
                started = clock.start()
                with region(self.profiler, "postprocess"):
                    answers = self.family.postprocess(outputs, batch.inputs)
                    for idx, envelope, first, count in spans:
                        self._answer(batch, idx, answers[first:first + count], envelope)
                clock.stop("postprocess", started)
                attribute_gpu_time(clock, gpu.elapsed_ms())
            except Exception:  # one request's items made the batch fail: each request again, on its own
                log.exception("a batch of %d request(s) failed: computing each on its own", len(spans))
                self._one_by_one(batch)
                clock.stop("inference", started)

        for idx, envelope, _, count in spans:  # a request without items (OpenAI's models list) is answered as it is
            if count == 0:
                self._answer(batch, idx, [], envelope)
        if self.batch_cache is not None:
            self.batch_cache.remember(batch.repeats, context, results, batch.refused, self.reject)
        batch.deadlines.count_late(idx for idx, _, _, _ in spans)
        if batch.items:
            self.service_time.update(clock.elapsed_ms)
        emit(getattr(context, "metrics", None), self.model_name, clock, batch.items, self.gpu_gauges.read())
        emit_deadlines(getattr(context, "metrics", None), self.model_name, batch.deadlines)
        if self.tracing is not None:
            self.tracing.record_batch(context, batch.size, [idx for idx, *_ in spans], batch.refused, clock, batch.items)
        if self.profiler is not None:
            self.profiler.step()
        return results

    def _one_by_one(self, batch: Prepared) -> None:
        """Each request's items as a batch of their own: a request that fails alone gets its 500."""
        for idx, envelope, first, count in batch.spans:
            if count == 0:
                continue
            try:
                inputs = self.family.collate(batch.decoded[first:first + count])
                self._answer(batch, idx, self.family.postprocess(self.infer(inputs), inputs), envelope)
            except Exception:  # a fault of ours no check foresaw, with this request alone
                log.exception("request %d failed on its own", idx)
                self._refuse(batch, {idx: ServerFault("the model failed on this request (the model log has the "
                                                      "traceback)")})

    def _answer(self, batch: Prepared, idx: int, answers: list[Any], envelope) -> None:
        """One request's answer written, or its 500 when the answer cannot be right."""
        if not all_finite(answers):
            self._refuse(batch, {idx: ServerFault("the model's answer holds NaN or infinity")})
            return
        try:
            batch.results[idx] = self.encode(batch.context, idx, answers, envelope)
        except Exception:  # a fault of ours in wrapping: this request's 500, its batch-mates answered
            log.exception("unexpected error wrapping the answer of request %d", idx)
            self._refuse(batch, {idx: ServerFault("unexpected error wrapping the answer (the model log has the "
                                                  "traceback)")})

    def _refuse(self, batch: Prepared, errors: dict[int, HandlerError]) -> None:
        for idx, err in errors.items():
            batch.refused[idx] = err
            batch.results[idx] = self.reject(batch.context, idx, err)

    def _cache_key(self, data: list[Any], context, idx: int):
        """What the response cache keys a request by, or None when it may not be cached: /predictions
        answers only, unless the client asked for a fresh one (Cache-Control: no-cache)."""
        headers = request_headers(context, idx)
        if "no-cache" in (kserve.header(headers, "cache-control") or "").lower():
            return None
        if kserve.from_kserve_route(headers) or routes.is_openai(openai_envelope.url_path(headers)):
            return None
        return request_body(data[idx]), content_type(context, idx)

    def decode_all(self, data: list[Any], context, indices: Optional[list[int]] = None) -> list[Any]:
        """Each request decoded on its own: (its KServe envelope or None for /predictions, its items:
        one per instance), or the HandlerError that rejects it alone (`indices`: only these)."""

        def unwrap_one(idx: int):
            try:
                body, media_type, headers = request_body(data[idx]), content_type(context, idx), request_headers(context, idx)
                envelope = (openai_envelope.unwrap(body, headers, self.family, self.model_name, self.loaded_at)
                            or kserve.unwrap(body, headers, self.family.input_kind))
                return envelope, ((body, media_type),) if envelope is None else envelope.bodies
            except HandlerError as err:
                return err
            except Exception:  # a fault of ours no check foresaw: this request's 500, the batch goes on
                return _fault(idx)

        def decode_one(job):
            idx, body, media_type = job
            try:
                return self.family.decode(body, media_type)
            except HandlerError as err:
                return err
            except Exception:  # as above
                return _fault(idx)

        unwrapped = [unwrap_one(idx) for idx in (range(len(data)) if indices is None else indices)]
        jobs = [(idx, *body) for idx, outcome in enumerate(unwrapped) if not isinstance(outcome, HandlerError)
                for body in outcome[1]]
        if self.decode_pool is None or len(jobs) <= 1:
            decoded = [decode_one(job) for job in jobs]
        else:  # image decoding and resizing release the GIL: a batch decodes on several cores at once
            decoded = list(self.decode_pool.map(decode_one, jobs))
        outcomes, at = [], 0
        for outcome in unwrapped:
            if isinstance(outcome, HandlerError):
                outcomes.append(outcome)
                continue
            envelope, bodies = outcome
            mine, at = decoded[at:at + len(bodies)], at + len(bodies)
            failed = next(((i, d) for i, d in enumerate(mine) if isinstance(d, HandlerError)), None)
            if failed is None:
                outcomes.append((envelope, mine))
            else:  # one bad instance rejects its whole request, naming the instance
                outcomes.append(failed[1] if envelope is None else kserve.instance_error(failed[1], failed[0]))
        return outcomes

    def decode_each(self, data: list[Any], context, indices: list[int]) -> list[Any]:
        """Each request decoded by the family on its own: the item, or the HandlerError rejecting it."""
        outcomes = []
        for request, idx in zip(data, indices):
            if self.family.generates and routes.is_openai(openai_envelope.url_path(request_headers(context, idx))):
                # Reached only in step mode: the async service answers OpenAI's routes before decoding.
                outcomes.append(OpenAIError(routes.STEP_MODE_HAS_NO_OPENAI, status=404))
                continue
            try:
                outcomes.append(self.family.decode(request_body(request), content_type(context, idx)))
            except HandlerError as err:
                outcomes.append(err)
            except Exception:  # a fault of ours no check foresaw: this request's 500, the batch goes on
                outcomes.append(_fault(idx))
        return outcomes

    def infer(self, inputs):
        """The model on one collated batch, in the passes its family chooses (Family.run)."""
        return self.family.run(self._forward, inputs)

    def _forward(self, inputs):
        """One forward pass: each input tensor on the device in the model's layout; on a GPU padded up
        to its bucket (the padding's rows are dropped from the outputs)."""
        tensors = self.family.model_inputs(inputs)
        rows = tensors[0].shape[0]
        padded = self.device.type == "cuda" and device.bucket_for(rows, self.buckets) != rows
        if padded:
            tensors = device.pad_rows(tensors, device.bucket_for(rows, self.buckets))
        channels_last = self.settings.runtime.channels_last
        # ONNX Runtime takes host arrays whatever its provider: its inputs stay where they are.
        target = torch.device("cpu") if isinstance(self.model, OnnxModule) else self.device
        tensors = tuple(runtime.to_device(runtime.memory_format(t, channels_last), target) for t in tensors)
        with torch.inference_mode(), runtime.autocast(self.device, self.autocast_dtype):
            outputs = self.model(*tensors)
        return outputs[:rows] if padded else outputs

    def encode(self, context, idx: int, answers: list[Any], envelope: Optional[kserve.Envelope] = None) -> bytes:
        return encode_answer(context, idx, answers, envelope, self.model_name)

    reject = staticmethod(reject)


def _fault(idx: int) -> ServerFault:
    log.exception("unexpected error decoding request %d", idx)
    return ServerFault("unexpected error decoding the request (the model log has the traceback)")


def _model_version(context) -> str:
    """The archive's version (config.properties' models= is keyed by it)."""
    manifest = getattr(context, "manifest", None) or {}
    return str((manifest.get("model") or {}).get("modelVersion", "1.0"))
