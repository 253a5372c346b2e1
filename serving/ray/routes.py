"""The ingress app: every route of the served models that is not `/predictions/<model>` (each model's
own app takes that one: Serve routes by the longest prefix, so the main route has no extra hop).

    GET  /ping                                   {"status": "Healthy"} (TorchServe's)
    POST /v1/models/<m>:predict                  KServe v1
    GET  /v1/models/<m>                          KServe v1 readiness: {"name", "ready"}; for an LM also
                                                 OpenAI's model object (`id`, `object`, `created`, `owned_by`)
    GET  /v2                                     Open Inference Protocol v2: server metadata
    GET  /v2/health/live, /v2/health/ready       server liveness, readiness (every model answers)
    GET  /v2/models/<m>[/versions/<v>]           model metadata
    GET  /v2/models/<m>[/versions/<v>]/ready     model readiness
    POST /v2/models/<m>[/versions/<v>]/infer     inference (JSON, or the binary tensor extension)

Health and server metadata answer without a key (probes); everything naming a model takes the
inference key and the size limit /predictions takes (serving/ray/routes_door.py). A model's request
goes to its app's deployment (`infer`, `metadata`) through Serve's handle; an unknown model gets
TorchServe's 404 ModelNotFoundException; one whose replicas hold all they may (Serve's limits: what
TorchServe's job queue and batch hold) gets TorchServe's 503 ServiceUnavailableException at once.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Optional

from ray import serve
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from serving.ray import generation
from serving.ray.app import http
from serving.ray.routes_config import DEFAULT_JOB_QUEUE_SIZE, DEFAULT_MAX_REQUEST_SIZE, INGRESS_DEPLOYMENT
from serving.ray.routes_door import admit, authorised, error, inference_key, invalid_key, json_response, queue_full

SERVER_NAME = "ts-ray"
READY_TIMEOUT_S = 5.0
_V1 = re.compile(r"^/v1/models/(?P<model>[^/:]+)(?P<verb>:predict)?$")
_V2 = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<tail>/ready|/infer)?$")


@serve.deployment(name=INGRESS_DEPLOYMENT)
class Ingress:
    def __init__(self, models: list[str], key_file: str = "", max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
                 version: str = "", job_queue_size: int = DEFAULT_JOB_QUEUE_SIZE) -> None:
        self.models = tuple(models)
        self.key = inference_key(key_file)
        self.max_request_size = int(max_request_size)
        self.job_queue_size = int(job_queue_size)
        self.version = version
        self._handles: dict[str, Any] = {}

    def _handle(self, model: str) -> Optional[Any]:
        if model not in self.models:
            return None
        if model not in self._handles:
            self._handles[model] = serve.get_app_handle(model)
        return self._handles[model]

    async def _ready(self, model: str) -> bool:
        handle = self._handle(model)
        if handle is None:
            return False
        try:
            await asyncio.wait_for(handle.metadata.remote(), READY_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - any failure of the model's app (absent, starting, dead): not ready
            return False
        return True

    async def __call__(self, request: HttpRequest) -> Response:
        path, method = request.url.path.rstrip("/") or "/", request.method
        if path == "/ping":
            ready = all(await asyncio.gather(*(self._ready(m) for m in self.models)))
            return json_response({"status": "Healthy" if ready else "Unhealthy"}, 200 if ready else 500)
        if path == "/v2/health/live":
            return Response(status_code=200)
        if path == "/v2/health/ready":
            ready = all(await asyncio.gather(*(self._ready(m) for m in self.models)))
            return Response(status_code=200 if ready else 503)
        if path == "/v2" and method == "GET":
            return json_response({"name": SERVER_NAME, "version": self.version,
                                  "extensions": ["binary_tensor_data", "model_repository"]}, 200)
        if path in generation.OPENAI_PATHS:  # OpenAI's plain /v1: to the LM the request names
            return await generation.openai(request, self.models, self._handle, self.key, self.max_request_size)
        v1, v2 = _V1.match(path), _V2.match(path)
        match = v1 or v2
        if match is None:
            return error(404, "ResourceNotFoundException", f"Requested resource is not found: {path}")
        if not authorised(request.headers.get("authorization", ""), self.key):
            return invalid_key()
        model = match.group("model")
        handle = self._handle(model)
        if handle is None:
            return error(404, "ModelNotFoundException", f"Model not found: {model}")
        tail = v1.group("verb") if v1 else v2.group("tail")
        if tail in (":predict", "/infer"):
            if method != "POST":
                return error(405, "MethodNotAllowedException", f"{path}: send a POST")
            body, refusal = await admit(request, self.key, self.max_request_size)
            if refusal is not None:
                return refusal
            try:
                return http(await handle.infer.remote(dict(request.headers.items()), body))
            except BackPressureError:
                return queue_full(model, self.job_queue_size)
        if tail == "/ready":
            return Response(status_code=200 if await self._ready(model) else 503)
        if v1:  # one path, two protocols: KServe's fields and, for an LM, OpenAI's beside them
            ready = await self._ready(model)
            card = await generation.model_card(model, handle, dict(request.headers.items())) if ready else {}
            return json_response({"name": model, "ready": ready, **card}, 200 if ready else 503)
        return json_response(await handle.metadata.remote(), 200)


def build(args: dict[str, Any]) -> serve.Application:
    """The import path the ingress app names (serving.ray.routes:build)."""
    return Ingress.bind(list(args["models"]), args.get("key_file", ""),
                        int(args.get("max_request_size", DEFAULT_MAX_REQUEST_SIZE)), str(args.get("version", "")),
                        int(args.get("job_queue_size", DEFAULT_JOB_QUEUE_SIZE)))

