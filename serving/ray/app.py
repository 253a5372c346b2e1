"""The Ray Serve app that serves one model archive through the archive's own handler.

One app per model, at `/predictions/<model>` (TorchServe's route, OpenAI's `.../<version>/v1/...`
under it); the ingress app (serving/ray/routes.py) sends it the KServe v1 / Open Inference Protocol v2
requests through `infer` and asks `metadata` for the protocol's model metadata. Its deployment:

- at start-up unpacks the archive under the cluster's folder, puts the archive's folder first on
  `sys.path` (as TorchServe's worker does, so the handler package shipped inside the archive is the
  one that runs) and starts its `Handler` on the Ray engine adapter (handlers/engines/ray.py);
- holds `job_queue_size` requests waiting besides a batch in progress, as TorchServe's queue does:
  Serve's replica limits (serving/ray/routes_config.py) refuse the next with a 503 at once;
- reads each request once at the door (key, size, headers, body) into a `Request` record of the
  handler package; it batches the records with `@serve.batch`: `max_batch_size` and
  `batch_wait_timeout_s` come from the app's args (TorchServe's batchSize and maxBatchDelay) and a
  deployment's `user_config` changes them at runtime (`reconfigure`);
- runs one batch at a time through the handler's batch loop (the one TorchServe's path runs) on the
  replica's own event loop, as TorchServe's worker runs its batches on its one thread, and answers
  each request with its own `Reply`: a bad request gets its own 4xx while its batch-mates get 200.
  Not on a thread of its own: the event loop and the forward pass would then trade the GIL back and
  forth (a convoy), which costs more CPU per request than it overlaps (docs/ray.md#one-thread-per-replica).
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import ray
from ray import serve
from ray.serve import metrics as serve_metrics
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from serving.ray import generation
from serving.ray.archive import Archive
from serving.ray.routes_config import DEFAULT_MAX_REQUEST_SIZE, DEPLOYMENT
from serving.ray.routes_door import admit, inference_key, url_path

PLAIN, KSERVE = "plain", "kserve"  # the handler package's route names (handlers/request.py)


def replica_cpus() -> int:
    """The CPUs Ray gave this replica (`ray_actor_options.num_cpus`: the plan's threads per worker)."""
    return max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))


def with_threads(model_config: Mapping[str, Any], cpus: int) -> dict[str, Any]:
    """The archive's model-config with the replica's CPUs as its thread count, unless the archive sets
    one: as TorchServe's plan does, so replicas sharing the cores do not oversubscribe them."""
    config = dict(model_config)
    handler = dict(config.get("handler") or {})
    runtime = dict(handler.get("runtime") or {})
    if runtime.get("threads") is None:
        runtime["threads"] = cpus
    config["handler"] = {**handler, "runtime": runtime}
    return config


def wire(reply: Any) -> tuple[int, str, dict[str, str], bytes]:
    """A Reply as plain values (status, content type, headers, body) that travel between replicas."""
    return reply.status, reply.content_type, dict(reply.headers), reply.body


def http(answer: tuple[int, str, dict[str, str], bytes]) -> Response:
    status, content_type, headers, body = answer
    return Response(body, status_code=status, media_type=content_type or None, headers=headers)


@serve.deployment(name=DEPLOYMENT)
class ArchiveDeployment:
    """One replica: one handler, like one TorchServe worker."""

    def __init__(self, model: str, archive: str, unpack_root: str, key_file: str = "",
                 max_batch_size: int = 1, batch_wait_timeout_s: float = 0.1,
                 max_request_size: int = DEFAULT_MAX_REQUEST_SIZE) -> None:
        self.model = model
        self.prefix = f"/predictions/{model}"
        self.key = inference_key(key_file)
        self.max_request_size = int(max_request_size)
        self.reconfigure({"max_batch_size": max_batch_size, "batch_wait_timeout_s": batch_wait_timeout_s})
        folder = Path(tempfile.mkdtemp(prefix=f"{model}-", dir=unpack_root))
        unpacked = Archive.unpack(Path(archive), folder)
        self.version = unpacked.version
        engines, ray_engine, handler_module = unpacked.import_package("handlers.engines", "handlers.engines.ray",
                                                                      "handlers.handler")
        self.open_http = ray_engine.open_http
        worker = engines.Worker(model_name=model, model_dir=folder, version=self.version,
                                max_batch_size=self.max_batch_size,
                                model_config=MappingProxyType(with_threads(unpacked.model_config, replica_cpus())))
        self.context = ray_engine.RayContext(worker, ray_engine.RayMetrics(serve_metrics))
        self.handler = handler_module.Handler(engine=ray_engine.Ray)
        self.handler.initialize(self.context)
        self.deadline_ms = self.handler.settings.runtime.deadline_ms

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve's user_config: max_batch_size and batch_wait_timeout_s, at start and at runtime."""
        if "max_batch_size" in user_config:
            self.max_batch_size = int(user_config["max_batch_size"])
            self.handle_batch.set_max_batch_size(self.max_batch_size)
        if "batch_wait_timeout_s" in user_config:
            self.handle_batch.set_batch_wait_timeout_s(float(user_config["batch_wait_timeout_s"]))

    async def __call__(self, request: HttpRequest) -> Response:
        """/predictions/<model>[/<version>][/v1/...]: TorchServe's route (and OpenAI's under it)."""
        body, refusal = await admit(request, self.key, self.max_request_size)
        if refusal is not None:
            return refusal
        return http(await self._answer(request.headers, body, PLAIN, url_path(request.url.path, self.prefix)))

    async def infer(self, headers: dict[str, str], body: bytes) -> tuple[int, str, dict[str, str], bytes]:
        """A KServe v1 / Open Inference Protocol v2 request the ingress admitted (key and size checked)."""
        return await self._answer(headers, body, KSERVE, "")

    def metadata(self) -> dict[str, Any]:
        """What the Open Inference Protocol's model metadata says of this model."""
        kind = self.handler.family.input_kind
        tensor_in = kind == "tensor"
        return {
            "name": self.model,
            "versions": [self.version],
            "platform": f"{self.handler.settings.runtime.graph}",
            "inputs": [{"name": "input-0", "datatype": "FP32" if tensor_in else "BYTES",
                        "shape": [-1, -1] if tensor_in else [-1]}],
            "outputs": [{"name": "output-0", "datatype": "FP32" if kind == "text" else "BYTES",
                         "shape": [-1, -1] if kind == "text" else [-1]}],
        }

    async def _answer(self, headers: Mapping[str, str], body: bytes, route: str,
                      path: str) -> tuple[int, str, dict[str, str], bytes]:
        record = self.open_http(headers, body, route, path, uuid.uuid4().hex, self.deadline_ms)
        return wire(await self.handle_batch(record))

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.1, max_concurrent_batches=1)
    async def handle_batch(self, batch: list[Any]) -> list[Any]:
        return self.handler.handle(batch, self.context)


def build(args: dict[str, Any]) -> serve.Application:
    """The import path Serve's config file names (serving.ray.app:build); `args` from the config."""
    if generation.serves(Path(args["archive"])):  # TorchServe's async mode: the causal LM's engine loop
        return generation.build(args)
    return ArchiveDeployment.bind(args["model"], args["archive"], args["unpack_root"], args.get("key_file", ""),
                                  int(args.get("max_batch_size", 1)), float(args.get("batch_wait_timeout_s", 0.1)),
                                  int(args.get("max_request_size", DEFAULT_MAX_REQUEST_SIZE)))
