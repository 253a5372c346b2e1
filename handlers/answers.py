"""How one request's answer or refusal is written into TorchServe's context: bytes (sent as they
are, handlers/encoding.py), its content type, its status and reason phrase, and the envelope of the
protocol it came in (plain /predictions, KServe v1 / Open Inference Protocol v2, OpenAI)."""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Optional

import numpy as np

from handlers import kserve
from handlers.encoding import JSON, json_bytes
from handlers.errors import HandlerError
from handlers.openai import envelope as openai_envelope
from handlers.openai import routes
from handlers.openai.errors import error_body
from handlers.request_parts import request_headers

log = logging.getLogger(__name__)

_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")


def status_phrase(message: str) -> str:
    """HTTP reason phrases must be one printable ASCII line (TorchServe's worker also writes a phrase's
    length in characters and its bytes in UTF-8: anything else desynchronises the frontend)."""
    return _UNPRINTABLE.sub(" ", message)[:200].strip() or "error"


def set_status(context, idx: int, err: HandlerError) -> None:
    """The one place a request's error status and reason phrase are written."""
    context.set_response_status(err.status, status_phrase(err.message), idx)


def close_replies(context, size: int) -> None:
    """Mark each gRPC request's answer as its last. A request without the `explain` header the REST
    routes add came over gRPC; TorchServe 0.12's frontend reads `ts_stream_next` on every answer to
    gRPC StreamPredictions and, when it is absent, fails the worker and every request of its batch.
    REST answers must not carry it (the frontend would send them as an unfinished stream)."""
    for idx in range(size):
        if kserve.header(request_headers(context, idx), "explain") is not None:
            continue
        try:
            if "ts_stream_next" not in (context.get_response_headers(idx) or {}):
                context.set_response_header(idx, "ts_stream_next", "false")
        except (AttributeError, IndexError, KeyError):  # a context that keeps no response headers
            continue


def json_answer(context, idx: int, answer: Any) -> bytes:
    context.set_response_content_type(idx, JSON)
    return json_bytes(answer)


def encode_answer(context, idx: int, answers: list[Any], envelope: Optional[kserve.Envelope], model_name: str) -> bytes:
    """A /predictions request's one answer as it is, a KServe or OpenAI request's answers wrapped in
    its protocol. An exception here is a fault of ours with this request: the caller refuses it alone."""
    if envelope is None:
        return json_answer(context, idx, answers[0])
    if envelope.protocol == openai_envelope.PROTOCOL:
        context.set_response_content_type(idx, JSON)
        return openai_envelope.wrap(envelope, answers)
    body, media_type, headers = kserve.encoded(envelope, answers, model_name)
    context.set_response_content_type(idx, media_type)
    for name, value in headers.items():  # the binary tensor extension's Inference-Header-Content-Length
        context.set_response_header(idx, name, value)
    return body


def all_finite(value: Any) -> bool:
    """No NaN or infinity anywhere in an answer (JSON has neither: the encoder would write null)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, np.ndarray):
            if item.dtype.kind in "fc" and not np.isfinite(item).all():
                return False
            if item.dtype == object:
                stack.extend(item.ravel().tolist())
        elif isinstance(item, np.floating):
            if not np.isfinite(item):
                return False
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return True


def reject(context, idx: int, err: HandlerError) -> bytes:
    """The request's error status and body, in the shape its route's clients read."""
    set_status(context, idx, err)
    if routes.is_openai(openai_envelope.url_path(request_headers(context, idx))):
        context.set_response_content_type(idx, JSON)
        return error_body(err)  # OpenAI's clients read {"error": {...}}
    answer = {"code": err.status, "type": err.kind, "message": err.message}
    if kserve.from_kserve_route(request_headers(context, idx)):
        answer["error"] = err.message  # where KServe / Open Inference Protocol clients read it
    return json_answer(context, idx, answer)
