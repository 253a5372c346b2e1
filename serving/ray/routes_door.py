"""What every HTTP entry of the Ray apps checks before a request reaches a model, as TorchServe's
frontend does: the inference key and the request's size. Shared by the model apps
(serving/ray/app.py, /predictions/<model>) and the ingress (serving/ray/routes.py, the other routes).

- Key: `Authorization: Bearer <inference key>` from the cluster's key_file.json (TorchServe's format);
  a missing or wrong key gets TorchServe's answer, HTTP 400 InvalidKeyException.
- Size: a body over `max_request_size` bytes (config.properties' key, TorchServe's default when the
  app is given none) gets 413 before it is read whole: a Content-Length over it at once, else as the
  streamed body passes it.

Nothing here imports the handler package (a model replica imports the archive's own copy).
"""

from __future__ import annotations

import hmac
import json
import re
from pathlib import Path
from typing import Any, Optional

from starlette.requests import Request as HttpRequest
from starlette.responses import Response

JSON = "application/json"
_VERSION = re.compile(r"^\d+(\.\d+)*$")

INVALID_KEY = {
    "code": 400,
    "type": "InvalidKeyException",
    "message": "Token Authorization failed. Token either incorrect, expired, or not provided correctly",
}


class TooLarge(Exception):
    """A body over the size limit."""


def inference_key(key_file: str) -> str:
    """The inference key of a TorchServe key_file.json ("" when the app runs without keys)."""
    if not key_file:
        return ""
    return json.loads(Path(key_file).read_text(encoding="utf-8"))["inference"]["key"]


def authorised(header: str, key: str) -> bool:
    """`Bearer <key>` (TorchServe's token auth), compared in constant time; no key: everyone."""
    if not key:
        return True
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def url_path(path: str, prefix: str) -> str:
    """What followed /predictions/<model>[/<version>]/ (TorchServe's `url_path`: OpenAI's routes);
    `path` with or without the app's route prefix (an ASGI server may have taken it off already)."""
    rest = path[len(prefix):] if path == prefix or path.startswith(prefix + "/") else path
    parts = [p for p in rest.split("/") if p]
    if parts and _VERSION.match(parts[0]):
        parts = parts[1:]
    return "/".join(parts)


def json_response(body: Any, status: int) -> Response:
    return Response(json.dumps(body, indent=2), status_code=status, media_type=JSON)


def error(status: int, kind: str, message: str) -> Response:
    """An error in TorchServe's frontend shape: {"code", "type", "message"}."""
    return json_response({"code": status, "type": kind, "message": message}, status)


def queue_full(model: str, job_queue_size: int) -> Response:
    """TorchServe's answer when a model's job queue is full: 503, ServiceUnavailableException."""
    return error(503, "ServiceUnavailableException",
                 f"Model \"{model}\" has {job_queue_size} requests waiting (job_queue_size) besides a batch in "
                 "progress: retry later, or serve it on more replicas")


def invalid_key() -> Response:
    return json_response(INVALID_KEY, 400)


def too_large(limit: int) -> Response:
    return error(413, "RequestEntityTooLarge", f"the request body is over max_request_size ({limit} bytes): "
                 "send a smaller one")


async def read_body(request: HttpRequest, limit: int) -> bytes:
    """The whole body, or TooLarge once it passes `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


async def admit(request: HttpRequest, key: str, limit: int) -> tuple[Optional[bytes], Optional[Response]]:
    """(body, None) for a request with the key and within the limit; else (None, the refusal)."""
    if not authorised(request.headers.get("authorization", ""), key):
        return None, invalid_key()
    try:
        return await read_body(request, limit), None
    except TooLarge:
        return None, too_large(limit)
