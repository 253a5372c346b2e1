"""A small client for TorchServe 0.12's gRPC inference API (InferenceAPIsService on
grpc_inference_port, 127.0.0.1:7070 for `make serve`).

    from serving.grpc_client import GrpcClient, HandlerRefused

    with GrpcClient.from_key_file("127.0.0.1:7070", "key_file.json") as client:
        client.predict("minilm", "A man is eating food.")        # the answer's bytes, as REST's body
        for chunk in client.stream_predict("tinylm", {"prompt": "The for statement", "stream": True}):
            print(chunk)                                           # one NDJSON line per message

What the frontend does with a call (its InferenceImpl, GRPCInterceptor and GRPCJob at v0.12.0):
- The key: metadata `authorization: Bearer <inference key>` (key_file.json's `inference` key, as
  REST's header). Missing or wrong: PERMISSION_DENIED before any model is looked up.
- The request is the model name, an optional version and a map of named byte strings; we send the
  body under `data`. No Content-Type and no other header reaches the handler, so a body must be in
  the form its family reads without one (serving/grpc_forms.py); metadata beyond the key stays in
  the frontend.
- A handler's own status for one request (our 400/413/500s) is dropped: GRPCJob.response ignores
  it, and the call ends OK carrying the handler's error body. This client recognises that body
  and raises HandlerRefused (status, message, and the gRPC code TorchServe's own mapping gives the
  status). Errors of the frontend itself (a full queue, an unknown model, a dead worker) are gRPC
  statuses (grpc.RpcError), with a line naming a Java exception class under the message
  (`error_message` drops it).
- Predictions completes on the first response the worker sends; StreamPredictions sends one
  message per chunk and ends on the chunk marked last. A causal LM therefore streams over gRPC in
  the asynchronous worker mode only, with `"stream": true` (docs/api.md#grpc has the table): in
  step mode (continuousBatching) Predictions gets the first step alone and StreamPredictions
  stalls after its first message, and any answer sent in one piece over StreamPredictions (every
  non-generating model, a refused request) makes the frontend throw and lose the worker, so
  stream_predict refuses a body that does not ask for a stream.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from serving.client import Body, Tokens
from serving.grpc_stubs import load

# The frontend's max_request_size / max_response_size in config.properties (20 MiB): gRPC's own
# default (4 MiB) would refuse large answers on the client side.
MAX_MESSAGE_BYTES = 20 * 1024 * 1024
INPUT_NAME = "data"
# A Java exception's class name (`BadRequestException.()` is how the frontend writes some).
_JAVA_CLASS = re.compile(r"^([a-z_][\w$]*\.)*[A-Z][\w$]*Exception(\.\(\))?$")
# TorchServe's HTTP status -> gRPC status (GRPCUtils.getGRPCStatusCode at v0.12.0).
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
          403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND, 409: grpc.StatusCode.ABORTED,
          413: grpc.StatusCode.RESOURCE_EXHAUSTED, 416: grpc.StatusCode.OUT_OF_RANGE, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
          499: grpc.StatusCode.CANCELLED, 501: grpc.StatusCode.UNIMPLEMENTED, 503: grpc.StatusCode.UNAVAILABLE,
          504: grpc.StatusCode.DEADLINE_EXCEEDED}


def grpc_code(status: int) -> grpc.StatusCode:
    """The gRPC status TorchServe gives an HTTP status when it maps one (frontend errors)."""
    if status in _CODES:
        return _CODES[status]
    if 200 <= status < 300:
        return grpc.StatusCode.OK
    if 400 <= status < 500:
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL if 500 <= status < 600 else grpc.StatusCode.UNKNOWN


class HandlerRefused(Exception):
    """The handler answered this request with an error status (its body {"code", "type", "message"}),
    which TorchServe 0.12's gRPC delivers as a successful call."""

    def __init__(self, status: int, kind: str, message: str, body: bytes) -> None:
        super().__init__(f"{status} {kind}: {message}")
        self.status, self.kind, self.message, self.body = status, kind, message, body

    @property
    def code(self) -> grpc.StatusCode:
        return grpc_code(self.status)


def refusal(answer: bytes) -> HandlerRefused | None:
    """The handlers' error body (handlers/handler.py Handler.reject) as an exception; None for an answer."""
    if not answer.startswith(b'{"code"'):
        return None
    try:
        body = json.loads(answer)
    except ValueError:
        return None
    if set(body) != {"code", "type", "message"} or not isinstance(body["code"], int) or body["code"] < 400:
        return None
    return HandlerRefused(body["code"], str(body["type"]), str(body["message"]), answer)


def encode(body: Body) -> bytes:
    """A mapping as JSON, text as UTF-8, bytes as they are: the frontend forwards raw bytes only."""
    if isinstance(body, Mapping):
        return json.dumps(body).encode("utf-8")
    if isinstance(body, str):
        return body.encode("utf-8")
    return bytes(body)


def error_message(err: grpc.RpcError) -> str:
    """The message of a failed call without the Java exception class line the frontend appends."""
    details = err.details() or ""
    message, _, last = details.rpartition("\n")
    return message if message and _JAVA_CLASS.match(last.strip()) else details


class GrpcClient:
    """One channel to one TorchServe's gRPC inference port. A call raises grpc.RpcError on a non-OK
    status, HandlerRefused when the handler refused the request (unless `raw=True`)."""

    def __init__(self, target: str, token: str = "", timeout_s: float = 120.0) -> None:
        self.target = target
        self.token = token
        self.timeout_s = timeout_s
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        self._channel = grpc.insecure_channel(target, options=options)
        stubs = load()
        self._messages = stubs.messages
        self._stub = stubs.services.InferenceAPIsServiceStub(self._channel)

    @classmethod
    def from_key_file(cls, target: str, key_file: str | Path, timeout_s: float = 120.0) -> GrpcClient:
        return cls(target, Tokens.from_key_file(Path(key_file)).inference, timeout_s)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> GrpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _metadata(self, token: str | None, headers: Mapping[str, str] | None) -> Sequence[tuple[str, str]]:
        """`token=None`: the client's key; `""`: no authorization; any other string: sent instead."""
        key = self.token if token is None else token
        pairs = [(name.lower(), value) for name, value in (headers or {}).items()]  # gRPC wants lower-case keys
        return pairs + ([("authorization", f"Bearer {key}")] if key else [])

    def _request(self, model: str, body: Body, version: str | None) -> Any:
        return self._messages.PredictionsRequest(model_name=model, model_version=version or "",
                                                 input={INPUT_NAME: encode(body)})

    def ping(self, *, token: str | None = None, timeout_s: float = 5.0) -> dict:
        """Ping: the frontend's health JSON ({"status": "Healthy"})."""
        from google.protobuf import empty_pb2

        reply = self._stub.Ping(empty_pb2.Empty(), metadata=self._metadata(token, None), timeout=timeout_s)
        return json.loads(reply.health)

    def predict(self, model: str, body: Body, version: str | None = None, *, token: str | None = None,
                headers: Mapping[str, str] | None = None, timeout_s: float | None = None, raw: bool = False) -> bytes:
        """Predictions: the answer's bytes. `headers`: more metadata (they reach the frontend, not the
        handler). `raw=True`: a handler's error body is returned as it came, not raised."""
        reply = self._stub.Predictions(self._request(model, body, version), metadata=self._metadata(token, headers),
                                       timeout=timeout_s or self.timeout_s)
        refused = None if raw else refusal(reply.prediction)
        if refused is not None:
            raise refused
        return reply.prediction

    def stream_predict(self, model: str, body: Body, version: str | None = None, *, token: str | None = None,
                       headers: Mapping[str, str] | None = None, timeout_s: float | None = None,
                       raw: bool = False) -> Iterator[bytes]:
        """StreamPredictions: each chunk's bytes as it arrives (a causal LM's NDJSON lines; an answer
        sent in one piece is one message). Leaving the loop early cancels the call."""
        call = self._stub.StreamPredictions(self._request(model, body, version), metadata=self._metadata(token, headers),
                                            timeout=timeout_s or self.timeout_s)
        try:
            for reply in call:
                refused = None if raw else refusal(reply.prediction)
                if refused is not None:
                    raise refused
                yield reply.prediction
        finally:
            call.cancel()  # a no-op once the stream has ended
