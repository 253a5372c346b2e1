"""The Ray Serve app of a causal LM in the async mode: the same engine loop TorchServe's asynchronous
worker runs (handlers/generation/engine_loop.py), as an asyncio task in each replica.

An archive whose model-config asks for TorchServe's asynchronous worker mode (`asyncCommunication:
true`, the causal LM's `mode: async`) or for its continuous batching (`continuousBatching: true`,
`mode: step`) is served by this deployment instead of the batch one (serving/ray/app.py's `build`
hands it over). Step mode is a protocol of TorchServe's frontend (it sends the running requests back
each step), which Ray has not: there the same archive runs the engine loop. Per replica:

- at start-up the archive's own `AsyncHandler` on the Ray streaming adapter
  (handlers/engines/ray_stream.py), warmed up as TorchServe's worker warms it, with the replica's
  CPUs (`ray_actor_options.num_cpus`) as its intra-op threads unless the archive sets them;
- each request is one coroutine: its record goes to the engine loop, which every replica's asyncio
  loop steps for all requests it holds (continuous batching); what the loop streams for a request
  goes into that request's own queue and out to its client as it comes;
- the answer's status is known before its first byte: a request refused (400, 404, 413, 507) gets
  its own status and body; a streamed one (`"stream": true`) answers 200 with TorchServe's content
  type (NDJSON, or OpenAI's Server-Sent Events) and its chunks, the same bytes TorchServe sends;
- a client that hangs up releases its sequence at the next step (TorchServe's async protocol cannot
  tell a worker so; Ray's proxy cancels the request).

Routes: `/predictions/<lm>[/<version>]` and OpenAI's under it (`.../v1/completions`,
`.../v1/chat/completions`, `.../v1/models`), as on TorchServe; OpenAI's at a plain `/v1` through the
ingress app (serving/ray/routes.py calls `openai`), which sends a request to the LM its `model` field
names. Replicas: the app's `num_replicas` (TorchServe allows one continuous-batching worker per model);
Serve's router spreads requests over them.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import sys
import tempfile
import uuid
import zipfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional

import ray
import yaml
from ray import serve
from ray.serve import metrics as serve_metrics
from starlette.requests import Request as HttpRequest
from starlette.responses import Response, StreamingResponse

from serving.errors import StartupError
from serving.ray.archive import Archive
from serving.ray.routes_config import DEFAULT_MAX_REQUEST_SIZE, DEPLOYMENT
from serving.ray.routes_door import admit, inference_key, json_response, url_path

log = logging.getLogger(__name__)

PLAIN = "plain"  # the handler package's route name (handlers/request.py): OpenAI's follows from url_path
OPENAI_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models"})


ENGINE_LOOP_MODES = ("asyncCommunication", "continuousBatching")  # TorchServe's async and step modes


def serves(archive: Path) -> bool:
    """Whether this archive's causal LM generates a step at a time (TorchServe's async or step mode):
    on Ray both run the engine loop."""
    try:
        with zipfile.ZipFile(archive) as mar:
            config = yaml.safe_load(mar.read("model-config.yaml")) if "model-config.yaml" in mar.namelist() else {}
    except (OSError, zipfile.BadZipFile, yaml.YAMLError) as exc:
        raise StartupError(f"{archive}: not a readable model archive ({exc}); rebuild it: "
                           ".venv/bin/python -m build") from exc
    return any((config or {}).get(mode, False) for mode in ENGINE_LOOP_MODES)


def engine_loop_config(model_config: Mapping[str, Any]) -> dict[str, Any]:
    """The archive's model-config as the replica's handler reads it: the async mode, whichever of
    TorchServe's step-at-a-time modes the archive was built for."""
    out = {k: v for k, v in model_config.items() if k not in ENGINE_LOOP_MODES}
    return {**out, "asyncCommunication": True}


def with_threads(config: Mapping[str, Any], cpus: int) -> dict[str, Any]:
    """The archive's model-config with the replica's CPUs as its intra-op threads, unless the archive
    names its own: Ray's `num_cpus` per replica is the plan's threads per worker, and the handler's
    own count (the cores shared by the workers it can see) would give every replica all the cores."""
    handler = dict(config.get("handler") or {})
    runtime = dict(handler.get("runtime") or {})
    if runtime.get("threads") is None:
        runtime["threads"] = max(1, cpus)
    return {**config, "handler": {**handler, "runtime": runtime}}


def _assigned_cpus() -> int:
    return int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1))


@dataclass(frozen=True)
class Head:
    """What an answer starts with: its status, content type and headers, and whether chunks follow as
    they are made (a stream) or the body comes whole."""

    status: int
    content_type: Optional[str]
    headers: Mapping[str, str]
    streaming: bool


async def respond(chunks: AsyncIterator[Any]) -> Response:
    """The HTTP response for an answer `GenerationDeployment.answer` yields (a Head, then bytes)."""
    head: Head = await chunks.__anext__()
    if head.streaming:
        return StreamingResponse(chunks, status_code=head.status, media_type=head.content_type,
                                 headers=dict(head.headers))
    body = b"".join([chunk async for chunk in chunks])
    return Response(body, status_code=head.status, media_type=head.content_type, headers=dict(head.headers))


@serve.deployment(name=DEPLOYMENT)
class GenerationDeployment:
    """One replica: one AsyncHandler and its engine loop, like TorchServe's one async worker."""

    def __init__(self, model: str, archive: str, unpack_root: str, key_file: str = "",
                 max_request_size: int = DEFAULT_MAX_REQUEST_SIZE) -> None:
        self.model = model
        self.prefix = f"/predictions/{model}"
        self.key = inference_key(key_file)
        self.max_request_size = int(max_request_size)
        folder = Path(tempfile.mkdtemp(prefix=f"{model}-", dir=unpack_root))
        unpacked = Archive.unpack(Path(archive), folder)
        self.version = unpacked.version
        sys.path.insert(0, str(folder))  # the archive's handler package, not the repository's
        try:
            engines = importlib.import_module("handlers.engines")
            ray_engine = importlib.import_module("handlers.engines.ray")
            stream = importlib.import_module("handlers.engines.ray_stream")
        except ImportError as exc:
            raise StartupError(f"{archive}: its handler package has no Ray streaming adapter ({exc}); rebuild it: "
                               ".venv/bin/python -m build") from exc
        handler_module = importlib.import_module("handlers.async_handler")
        self.open_http = ray_engine.open_http
        worker = engines.Worker(model_name=model, model_dir=folder, version=unpacked.version, max_batch_size=1,
                                model_config=MappingProxyType(with_threads(engine_loop_config(unpacked.model_config),
                                                                           _assigned_cpus())))
        self.context = stream.StreamContext(worker, ray_engine.RayMetrics(serve_metrics))
        self.handler = handler_module.AsyncHandler(engine=stream.RayStream)
        self.handler.initialize(self.context)

    def generates(self) -> bool:
        """What the ingress asks to find the LMs among the served models (serving.ray.generation.openai)."""
        return True

    def metadata(self) -> dict[str, Any]:
        """The Open Inference Protocol's model metadata, what the ingress's readiness routes (/ping,
        KServe v1 and v2 readiness) ask every model: a prompt in, text out."""
        return {"name": self.model, "versions": [self.version], "platform": "causal_lm",
                "inputs": [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}],
                "outputs": [{"name": "output-0", "datatype": "BYTES", "shape": [-1]}]}

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve's user_config: the batching keys the launcher writes for every app do not apply to
        the engine loop (it admits requests as they come, up to the archive's max_running)."""

    async def __call__(self, request: HttpRequest) -> Response:
        """/predictions/<model>[/<version>][/v1/...]: TorchServe's route (and OpenAI's under it)."""
        body, refusal = await admit(request, self.key, self.max_request_size)
        if refusal is not None:
            return refusal
        return await respond(self.answer(dict(request.headers.items()), body,
                                         url_path(request.url.path, self.prefix)))

    async def answer(self, headers: dict[str, str], body: bytes, path: str) -> AsyncIterator[Any]:
        """One request's answer: its Head, then its body in chunks (the ingress calls this through a
        streaming handle for OpenAI's plain /v1 routes)."""
        queue: asyncio.Queue = asyncio.Queue()
        request_id = uuid.uuid4().hex
        record = self.open_http(headers, body, PLAIN, path, request_id, None)
        task = asyncio.ensure_future(self.handler.handle([record], self.context.for_request(queue.put_nowait)))
        try:
            first = await _next(queue, task)
            if first is None:  # answered whole (a refusal, or not streamed)
                reply = self._reply(task)
                yield Head(reply.status, reply.content_type, dict(reply.headers), streaming=False)
                yield reply.body
                return
            yield Head(200, first.content_type, {}, streaming=True)
            yield first.body
            while (chunk := await _next(queue, task)) is not None:
                yield chunk.body
            while not queue.empty():
                yield queue.get_nowait().body
            yield self._reply(task).body
        finally:
            if not task.done():  # the client left: its sequence is released at the next step
                self.handler.generation.loop.cancel(request_id)
                task.cancel()

    def _reply(self, task: asyncio.Future) -> Any:
        try:
            (reply,) = task.result()
        except Exception:  # a fault of ours no check foresaw: this request's 500, the replica goes on
            log.exception("%s: the generation handler failed", self.model)
            return _Fault()
        return reply


class _Fault:
    status, content_type, headers = 500, "application/json", {}
    body = json.dumps({"code": 500, "type": "InternalServerException",
                       "message": "generation failed (the replica log has the traceback)"}).encode()


async def _next(queue: asyncio.Queue, task: asyncio.Future) -> Any:
    """The next streamed chunk, or None once the request's task has finished with none waiting."""
    if not queue.empty():
        return queue.get_nowait()
    getter = asyncio.ensure_future(queue.get())
    done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        return getter.result()
    getter.cancel()
    return queue.get_nowait() if not queue.empty() else None


async def openai(request: HttpRequest, models: tuple[str, ...], handle_of: Callable[[str], Any], key: str,
                 max_request_size: int) -> Response:
    """OpenAI's plain /v1 routes (the ingress's): a generation request goes to the LM its `model`
    names; GET /v1/models lists every LM served."""
    body, refusal = await admit(request, key, max_request_size)
    if refusal is not None:
        return refusal
    headers, path = dict(request.headers.items()), request.url.path.strip("/")
    lms = [m for m in models if await _generates(m, handle_of(m))]
    if path == "v1/models":
        listed = []
        for lm in lms:
            answer = await respond(handle_of(lm).options(stream=True).answer.remote(headers, b"", path))
            listed.extend(json.loads(answer.body)["data"])
        return json_response({"object": "list", "data": listed}, 200)
    try:
        named = json.loads(body or b"{}").get("model") if body else None
    except (ValueError, AttributeError, RecursionError):  # not a JSON object: the LM's own check names what is wrong
        named = None
    model = named if named in lms else lms[0] if len(lms) == 1 and named is None else None
    if model is None:
        return json_response({"error": {"message": f"The model `{named}` does not exist or is not served at "
                                                   f"this address (served: {', '.join(lms)}).",
                                        "type": "invalid_request_error", "param": "model",
                                        "code": "model_not_found"}}, 404)
    return await respond(handle_of(model).options(stream=True).answer.remote(headers, body, path))


async def model_card(model: str, handle: Any, headers: dict[str, str]) -> dict:
    """OpenAI's model object (`id`, `object`, `created`, `owned_by`) for an LM this ingress serves, as
    its app's `/v1/models` lists it (under the name OpenAI's clients use); {} for a model that does not generate."""
    if not await _generates(model, handle):
        return {}
    answer = await respond(handle.options(stream=True).answer.remote(headers, b"", "v1/models"))
    return next(iter(json.loads(answer.body)["data"]), {})  # an LM's app lists itself alone


_GENERATES: dict[str, bool] = {}  # per model app, in the ingress's process


async def _generates(model: str, handle: Any) -> bool:
    """Whether a model's app runs this deployment (it answers `generates`), asked once per model."""
    if model not in _GENERATES:
        try:
            _GENERATES[model] = bool(await handle.generates.remote())
        except Exception:  # noqa: BLE001 - the batch deployment has no `generates`: not an LM
            _GENERATES[model] = False
    return _GENERATES[model]


def build(args: dict[str, Any]) -> serve.Application:
    """serving.ray.app:build hands an async-mode archive's app here (the same `args`)."""
    return GenerationDeployment.bind(args["model"], args["archive"], args["unpack_root"], args.get("key_file", ""),
                                     int(args.get("max_request_size", DEFAULT_MAX_REQUEST_SIZE)))
