"""How a hostile test's requests travel: REST (a new connection per request, or a plain socket
whose reply is read byte for byte) and gRPC (Predictions, StreamPredictions), each read back as one
`Reply` whatever the route: a status (0: no valid reply in time), the body and its error message."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

import grpc
import requests

from serving.grpc_client import GrpcClient, error_message, refusal
from tests.e2e.hostile import raw_http
from tests.e2e.hostile.served import Served

TIMEOUT_S = float(os.environ.get("HOSTILE_TIMEOUT_S", "30"))
GRPC = "grpc:"  # Request.path prefix: grpc:Predictions/<model>, grpc:StreamPredictions/<model>

# gRPC status -> the HTTP status TorchServe maps to it (GRPCUtils at v0.12.0); DEADLINE_EXCEEDED and
# CANCELLED mean no answer in time. UNIMPLEMENTED is a refusal only where StreamPredictions is asked
# of a model that answers in one piece (the one call it may refuse that way).
_GRPC_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.FAILED_PRECONDITION: 400,
                grpc.StatusCode.OUT_OF_RANGE: 416, grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ABORTED: 409,
                grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.UNAUTHENTICATED: 401,
                grpc.StatusCode.RESOURCE_EXHAUSTED: 413, grpc.StatusCode.UNAVAILABLE: 503,
                grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNKNOWN: 500, grpc.StatusCode.DATA_LOSS: 500}


@dataclass(frozen=True)
class Request:
    """A POST to `path` (REST), or `grpc:<Method>/<model>` (gRPC: no content type, no headers)."""

    path: str
    body: bytes
    content_type: Optional[str] = None  # None: no Content-Type header
    headers: tuple[tuple[str, str], ...] = ()
    strict: bool = False  # REST: over a plain socket, the reply's bytes checked (tests/e2e/hostile/raw_http.py)

    def __repr__(self) -> str:
        return f"POST {self.path} {self.content_type!r} {len(self.body)} B: {self.body[:200]!r}"


@dataclass(frozen=True)
class Reply:
    status: int  # 0: no valid reply in time
    body: bytes
    message: str  # the error message its body carries
    problem: str = ""  # status 0: why
    headers: Mapping[str, str] = field(default_factory=dict)  # names lower-cased (REST only)


def body_message(body: bytes) -> str:
    """The error text of TorchServe's {"code", "type", "message"}, KServe's {"error": "..."} or
    OpenAI's {"error": {"message": ...}}; "" when the body carries none."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    if not isinstance(doc, dict):
        return ""
    error = doc.get("error")
    for found in (doc.get("message"), error, error.get("message") if isinstance(error, dict) else None):
        if isinstance(found, str) and found.strip():
            return found
    return ""


class Sender:
    """Sends a Request to one server, REST or gRPC, and reads what comes back as a Reply."""

    def __init__(self, served: Served, timeout_s: float = TIMEOUT_S) -> None:
        self.served, self.timeout_s = served, timeout_s
        self.grpc = (GrpcClient(served.grpc_target, served.tokens.inference, timeout_s)
                     if served.grpc_target is not None else None)

    def close(self) -> None:
        if self.grpc is not None:
            self.grpc.close()

    def send(self, request: Request, timeout_s: Optional[float] = None) -> Reply:
        timeout_s = timeout_s or self.timeout_s
        if request.path.startswith(GRPC):
            return self._grpc(request, timeout_s)
        headers = {"Authorization": f"Bearer {self.served.tokens.inference}", **dict(request.headers)}
        if request.content_type is not None:
            headers["Content-Type"] = request.content_type
        if request.strict:
            return self._strict(request, headers, timeout_s)
        try:  # a new connection each time: a reply that breaks HTTP framing cannot spill into the next
            resp = requests.post(f"{self.served.inference_url}{request.path}", data=request.body, headers=headers,
                                 timeout=(5, timeout_s))
        except requests.RequestException as exc:
            return Reply(0, b"", "", f"no valid HTTP reply within {timeout_s:.0f} s: {type(exc).__name__}: {exc}"[:400])
        return Reply(resp.status_code, resp.content, body_message(resp.content),
                     headers={k.lower(): v for k, v in resp.headers.items()})

    def _strict(self, request: Request, headers: dict, timeout_s: float) -> Reply:
        try:
            status, found, body = raw_http.exchange(self.served.inference_url, request.path, request.body, headers, timeout_s)
        except (raw_http.MalformedReply, OSError) as err:
            return Reply(0, b"", "", f"no valid HTTP reply: {type(err).__name__}: {err}"[:400])
        return Reply(status, body, body_message(body), headers=found)

    def _grpc(self, request: Request, timeout_s: float) -> Reply:
        method, model = request.path[len(GRPC):].split("/", 1)
        if self.grpc is None:
            raise AssertionError(f"gRPC {method} to {model}: {self.served.engine} serves no TorchServe gRPC")
        try:
            if method == "Predictions":
                chunks = [self.grpc.predict(model, request.body, raw=True, timeout_s=timeout_s)]
            else:
                chunks = list(self.grpc.stream_predict(model, request.body, raw=True, timeout_s=timeout_s))
        except grpc.RpcError as err:
            code = err.code()
            if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                return Reply(0, b"", "", f"gRPC {method}: {code.name} (no answer within {timeout_s:.0f} s)")
            if code is grpc.StatusCode.UNIMPLEMENTED:
                status = 405 if method == "StreamPredictions" else 501
            else:
                status = _GRPC_STATUS.get(code, 500)
            return Reply(status, b"", error_message(err), f"gRPC {code.name}")
        refused = next((r for r in map(refusal, chunks) if r is not None), None)
        if refused is not None:
            return Reply(refused.status, refused.body, refused.message)
        return Reply(200, b"".join(chunks), "")

    def together(self, requests_: Sequence[Request]) -> list[Reply]:
        """All at once: a barrier releases every thread together, so that they share a batch."""
        barrier = threading.Barrier(len(requests_))

        def go(request: Request) -> Reply:
            barrier.wait(timeout=30)
            return self.send(request)

        with ThreadPoolExecutor(max_workers=len(requests_)) as pool:
            return list(pool.map(go, requests_))
