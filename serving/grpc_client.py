"""A small client for TorchServe 0.12's gRPC inference API (InferenceAPIsService on
grpc_inference_port, 127.0.0.1:7070 for `make serve`).

    from serving.grpc_client import GrpcClient

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
- A handler's status becomes a gRPC status (400 INVALID_ARGUMENT, 413 RESOURCE_EXHAUSTED, 404
  NOT_FOUND, 503 UNAVAILABLE, other 4xx FAILED_PRECONDITION, 5xx INTERNAL), its message the
  details with a line naming the frontend's exception class after it (`handler_message` drops it).
- Predictions answers one message; StreamPredictions one message per chunk the handler sends, and
  ends on the chunk marked last.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from serving.client import Tokens
from serving.grpc_stubs import load

Body = bytes | str | Mapping[str, Any]
# The frontend's max_request_size / max_response_size in config.properties (20 MiB): gRPC's own
# default (4 MiB) would refuse large answers on the client side.
MAX_MESSAGE_BYTES = 20 * 1024 * 1024
# The frontend appends this line to a handler's message in the status details (augmentDescription).
FRONTEND_EXCEPTION = "org.pytorch.serve.http.InternalServerException"
INPUT_NAME = "data"
# A Java exception's class name (`BadRequestException.()` is how the frontend writes some).
_JAVA_CLASS = re.compile(r"^([a-z_][\w$]*\.)*[A-Z][\w$]*Exception(\.\(\))?$")


def encode(body: Body) -> bytes:
    """A mapping as JSON, text as UTF-8, bytes as they are: the frontend forwards raw bytes only."""
    if isinstance(body, Mapping):
        return json.dumps(body).encode("utf-8")
    if isinstance(body, str):
        return body.encode("utf-8")
    return bytes(body)


def handler_message(err: grpc.RpcError) -> str:
    """The handler's (or the frontend's) message of a failed call, without the Java exception line
    the frontend appends to it (FRONTEND_EXCEPTION for a handler's status, the frontend's own
    exception class for its refusals: ModelNotFoundException, ...)."""
    details = err.details() or ""
    message, _, last = details.rpartition("\n")
    return message if message and _JAVA_CLASS.match(last.strip()) else details


class GrpcClient:
    """One channel to one TorchServe's gRPC inference port. Calls raise grpc.RpcError on a non-OK status."""

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
                headers: Mapping[str, str] | None = None, timeout_s: float | None = None) -> bytes:
        """Predictions: the answer's bytes. `headers`: more metadata (they reach the frontend, not the handler)."""
        reply = self._stub.Predictions(self._request(model, body, version), metadata=self._metadata(token, headers),
                                       timeout=timeout_s or self.timeout_s)
        return reply.prediction

    def stream_predict(self, model: str, body: Body, version: str | None = None, *, token: str | None = None,
                       headers: Mapping[str, str] | None = None, timeout_s: float | None = None) -> Iterator[bytes]:
        """StreamPredictions: each chunk's bytes as it arrives (a causal LM's NDJSON lines, with
        `"stream": true` in the body). Leaving the loop early cancels the call."""
        call = self._stub.StreamPredictions(self._request(model, body, version), metadata=self._metadata(token, headers),
                                            timeout=timeout_s or self.timeout_s)
        try:
            for reply in call:
                yield reply.prediction
        finally:
            call.cancel()  # a no-op once the stream has ended
