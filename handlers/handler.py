"""The handler every archive runs: its start-up (settings -> runtime: threads, precision, graph,
device, warm-up) and its entry point, whatever the model.

The engine adapter (handlers/engines/, TorchServe's by default) is all it knows of its server: it
reads the worker's facts at start-up, turns each batch into `Request` records and writes the replies
back. The request loop itself is handlers/batch_loop.py (request/response families) or a generative
family's loops (handlers/generation/). The family named in the archive's settings (handlers/families/)
supplies what depends on the model's inputs and outputs.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Optional

import torch

from handlers import device, runtime, self_check, tracing
from handlers.aoti import load_aoti
from handlers.batch_loop import BatchLoop, decode_fault
from handlers.deadlines import ServiceTime
from handlers.engines.torchserve import TorchServe
from handlers.errors import ConfigError, HandlerError
from handlers.families import Family, family_class
from handlers.onnx_session import OnnxModule, load_onnx
from handlers.openai import routes
from handlers.openai.errors import OpenAIError
from handlers.profiling import make_profiler, region
from handlers.protocols import Reply
from handlers.protocols.kserve import KServeRoute
from handlers.protocols.openai import OpenAI
from handlers.protocols.plain import Plain
from handlers.repeats import BatchCache
from handlers.request import KSERVE, OPENAI, PLAIN, Request
from handlers.response_cache import ResponseCache
from handlers.settings import SERIALISED_GRAPHS, HandlerSettings
from handlers.worker_threads import worker_threads

log = logging.getLogger(__name__)

class Handler(BatchLoop):
    """The engine instantiates this once per worker (TorchServe: with no arguments)."""

    engine = TorchServe  # the engine adapter (handlers/engines/)

    def __init__(self, engine=None):
        if engine is not None:
            self.engine = engine
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
        worker = self.engine.worker(context)
        model_dir = Path(worker.model_dir)
        self.model_name = worker.model_name
        self.version = worker.version
        self.metrics_context = context  # what a generating worker's engine loop reports through
        self.loaded_at = int(time.time())  # OpenAI's models list: `created`
        yaml_config = worker.model_config
        self.settings = HandlerSettings.from_mapping(yaml_config.get("handler"))
        rt = self.settings.runtime
        self.placement = device.place(worker.gpu_id, rt.device)
        self.device = self.placement.device
        self.gpu_gauges = device.GpuGauges(self.device)
        device.emit_placement(self.engine.metrics(context), self.model_name, self.placement)
        self.max_batch_size = worker.max_batch_size
        workers = runtime.sibling_worker_count()
        own = yaml_config.get("minWorkers")
        self.threads, threads_from = worker_threads(rt, self.model_name, self.version,
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
        kind = self.family.input_kind
        self.protocols = {PLAIN: Plain(kind), KSERVE: KServeRoute(kind, self.model_name),
                          OPENAI: OpenAI(self.family, self.model_name, self.loaded_at)}
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
        if not self.family.generates:  # generation answers step by step, outside the stage clock
            self.tracing = tracing.make_tracing(tracing.TracingConfig.from_settings(rt.tracing, os.environ),
                                                self.model_name, self.version)
        # On a GPU a batch is padded up to a bucket: cudnn's autotuning and the warm-up see those shapes only.
        self.buckets = device.batch_buckets(self.max_batch_size)
        self_check.verify(model_dir, self.model_name, self.settings.variant, self.family, self.infer)  # or refuse to load
        if rt.cuda_graphs and self.device.type == "cuda" and not self.family.generates:
            from handlers.cuda_graphs import GraphedBuckets  # GPU workers only

            self.model = GraphedBuckets(self.model, self.device, self.autocast_dtype)
        if self.device.type == "cuda" and not self.family.generates and not isinstance(self.model, OnnxModule):
            self.model = device.MemoryGuard(self.model, self.device, max(self.buckets))  # out of memory: a 507
        if rt.warmup:
            warm, shapes = (self.generation.warm_up, None) if self.generation else \
                (self.infer, lambda size: self.family.warm_batches(size, every_shape=self.device.type == "cuda"))
            device.warm_up(warm, self.buckets, device.warm_calls(rt.graph, self.device), shapes)  # OOM: ends there
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
        if not weights.is_file():
            raise ConfigError(f"weights file {weights} does not exist: the archive lacks its "
                              f"{self.settings.weights}; rebuild it (make build)")
        if rt.graph == "torchscript":
            module = device.load_torchscript(str(weights), self.device)
            return torch.jit.optimize_for_inference(module) if rt.optimize_for_inference else module
        if rt.graph == "onnx":
            return load_onnx(weights, self.threads, device.check_onnx_provider(self.device))
        if rt.graph == "aoti":
            return load_aoti(weights, self.device)
        model = self.family.wrap(self.settings.source.build(model_dir))
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        model = runtime.prepare_eager(model, self.device, rt.channels_last)
        if rt.graph == "compile":
            return runtime.compile_model(model, rt.compile_mode)
        return model

    # ---- the entry point ------------------------------------------------------------------
    def handle(self, data: Optional[list[Any]], context) -> Optional[list[Any]]:
        if data is None:
            return None
        if self.generation is not None:
            with region(self.profiler, "generation_step"):
                answers = self.generation.handle(data, context)
            if self.profiler is not None:
                self.profiler.step()  # one decoding step (continuous batching) or one whole batch
            self.engine.reply(context, self.engine.requests(data, context, None), [None] * len(data))
            return answers
        requests = self.engine.requests(data, context, self.settings.runtime.deadline_ms)
        replies = self.complete(self.prepare(requests), self.engine.metrics(context))
        return self.engine.reply(context, requests, replies)

    # ---- what the generation loops call, per request -----------------------------------------
    def decode_each(self, data: list[Any], context, indices: list[int]) -> list[Any]:
        """Each request decoded by the family on its own: the item, or the HandlerError rejecting it."""
        outcomes = []
        for request in self.engine.requests(data, context, None, indices):
            if self.family.generates and request.route == OPENAI:
                # Reached only in step mode: the async service answers OpenAI's routes before decoding.
                outcomes.append(OpenAIError(routes.STEP_MODE_HAS_NO_OPENAI, status=404))
                continue
            outcomes.append(self.decode_request(request))
        return outcomes

    def decode_request(self, request: Request) -> Any:
        """One request's item decoded by the family, or the HandlerError rejecting it."""
        try:
            if request.error is not None:
                raise request.error
            return self.family.decode(request.body, request.media_type)
        except HandlerError as err:
            return err
        except Exception:  # a fault of ours no check foresaw: this request's 500, the batch goes on
            return decode_fault(request.index)

    def refusal(self, request: Request, err: HandlerError) -> Reply:
        """A refused request's Reply in its route's error shape."""
        return self.protocols[request.route].error(err)

    def reject(self, context, idx: int, err: HandlerError) -> bytes:
        """A refused request's body in its route's error shape, its status written."""
        (request,) = self.engine.requests([None], context, None, [idx])
        reply = self.refusal(request, err)
        self.engine.write(context, idx, reply)
        return reply.body

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
