"""The Ray Serve app that serves one model archive through the archive's own handler.

One app per model, at `/predictions/<model>` (TorchServe's route). Its deployment:

- at start-up unpacks the archive under the cluster's folder, puts the archive's folder first on
  `sys.path` (as TorchServe's worker does, so the handler package shipped inside the archive is the
  one that runs) and calls the handler's `initialize` once with a TorchServe-like context
  (serving/ray/context.py);
- batches with `@serve.batch`: `max_batch_size` and `batch_wait_timeout_s` come from the app's args
  (TorchServe's batchSize and maxBatchDelay; the launcher fills them from the archive and the
  caller); a deployment's `user_config` with the same keys changes them at runtime (`reconfigure`);
- runs one batch at a time on a thread of its own (the handler is synchronous), and answers each
  request with the status, content type and headers the handler set for it alone: a bad request
  gets its own 4xx while its batch-mates get 200;
- checks TorchServe's inference key (`Authorization: Bearer <key>` from the cluster's key_file.json);
  a missing or wrong key gets TorchServe's answer, HTTP 400 InvalidKeyException.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ray import serve
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from serving.ray.context import Archive, WorkerContext, authorised, decode_body, encode_answer, url_path
from serving.ray.serve_config import DEPLOYMENT

INVALID_KEY = {
    "code": 400,
    "type": "InvalidKeyException",
    "message": "Token Authorization failed. Token either incorrect, expired, or not provided correctly",
}


@dataclass(frozen=True)
class Incoming:
    body: bytes
    content_type: str
    headers: dict[str, str]
    request_id: str


@dataclass(frozen=True)
class Outgoing:
    status: int
    content_type: Optional[str]
    headers: dict[str, str]
    body: bytes


def inference_key(key_file: str) -> str:
    return json.loads(Path(key_file).read_text(encoding="utf-8"))["inference"]["key"]


@serve.deployment(name=DEPLOYMENT)
class ArchiveDeployment:
    """One replica: one handler, like one TorchServe worker."""

    def __init__(self, model: str, archive: str, unpack_root: str, key_file: str = "",
                 max_batch_size: int = 1, batch_wait_timeout_s: float = 0.1) -> None:
        self.model = model
        self.max_batch_size = max_batch_size
        self.reconfigure({"max_batch_size": max_batch_size, "batch_wait_timeout_s": batch_wait_timeout_s})
        self.prefix = f"/predictions/{model}"
        self.key = inference_key(key_file) if key_file else ""
        folder = Path(tempfile.mkdtemp(prefix=f"{model}-", dir=unpack_root))
        unpacked = Archive.unpack(Path(archive), folder)
        sys.path.insert(0, str(unpacked.model_dir))
        handler_module = importlib.import_module("handlers.handler")
        self.context = WorkerContext(model, unpacked, batch_size=self.max_batch_size)
        self.handler = handler_module.Handler()
        self.handler.initialize(self.context)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"handler-{model}")

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve's user_config: max_batch_size and batch_wait_timeout_s, at start and at runtime."""
        if "max_batch_size" in user_config:
            self.max_batch_size = int(user_config["max_batch_size"])
            self.handle_batch.set_max_batch_size(self.max_batch_size)
        if "batch_wait_timeout_s" in user_config:
            self.handle_batch.set_batch_wait_timeout_s(float(user_config["batch_wait_timeout_s"]))
        if hasattr(self, "context"):
            self.context.system_properties["batch_size"] = self.max_batch_size

    async def __call__(self, request: HttpRequest) -> Response:
        if self.key and not authorised(request.headers.get("authorization", ""), self.key):
            return Response(json.dumps(INVALID_KEY, indent=2), status_code=400, media_type="application/json")
        headers = {k.lower(): v for k, v in request.headers.items()}
        headers.update(explain="False", url_path=url_path(request.url.path, self.prefix))
        incoming = Incoming(await request.body(), request.headers.get("content-type", ""), headers,
                            uuid.uuid4().hex)
        out = await self.handle_batch(incoming)
        return Response(out.body, status_code=out.status, media_type=out.content_type, headers=out.headers)

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.1, max_concurrent_batches=1)
    async def handle_batch(self, batch: list[Incoming]) -> list[Outgoing]:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._run, batch)

    def _run(self, batch: list[Incoming]) -> list[Outgoing]:
        context = self.context.for_batch([r.headers for r in batch], [r.request_id for r in batch])
        data = [{"body": decode_body(r.body, r.content_type)} for r in batch]
        answers = self.handler.handle(data, context)
        if answers is None or len(answers) != len(batch):
            raise RuntimeError(f"{self.model}: the handler answered {0 if answers is None else len(answers)} "
                               f"of a batch of {len(batch)}")
        return [
            Outgoing(context.get_response_status(i)[0], context.get_response_content_type(i),
                     dict(context.get_response_headers(i)), encode_answer(answer))
            for i, answer in enumerate(answers)
        ]


def build(args: dict[str, Any]) -> serve.Application:
    """The import path Serve's config file names (serving.ray.app:build); `args` from the config."""
    return ArchiveDeployment.bind(args["model"], args["archive"], args["unpack_root"], args.get("key_file", ""),
                                  int(args.get("max_batch_size", 1)), float(args.get("batch_wait_timeout_s", 0.1)))
