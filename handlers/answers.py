"""How one request's answer or refusal is written into TorchServe's context: bytes (sent as they
are, handlers/encoding.py), its content type, its status and reason phrase, and the envelope of the
protocol it came in (plain /predictions, KServe v1 / Open Inference Protocol v2, OpenAI)."""

from __future__ import annotations

import logging
import re
from typing import Any, Optional

from handlers import kserve
from handlers.encoding import JSON, json_bytes
from handlers.errors import HandlerError, ServerFault
from handlers.openai import envelope as openai_envelope
from handlers.openai import routes
from handlers.openai.errors import error_body
from handlers.request_parts import request_headers

log = logging.getLogger(__name__)

_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")


def status_phrase(message: str) -> str:
    """HTTP reason phrases must be one printable ASCII line."""
    return _UNPRINTABLE.sub(" ", message)[:200].strip()


def json_answer(context, idx: int, answer: Any) -> bytes:
    context.set_response_content_type(idx, JSON)
    return json_bytes(answer)


def encode_answer(context, idx: int, answers: list[Any], envelope: Optional[kserve.Envelope], model_name: str) -> bytes:
    """A /predictions request's one answer as it is, a KServe or OpenAI request's answers wrapped in
    its protocol."""
    if envelope is None:
        return json_answer(context, idx, answers[0])
    try:
        if envelope.protocol == openai_envelope.PROTOCOL:
            context.set_response_content_type(idx, JSON)
            return openai_envelope.wrap(envelope, answers)
        return json_answer(context, idx, kserve.wrap(envelope, answers, model_name))
    except Exception:  # a fault of ours in wrapping: this request's 500, its batch-mates answered
        log.exception("unexpected error wrapping the answer of request %d", idx)
        return reject(context, idx, ServerFault("unexpected error wrapping the answer (the model log has "
                                                "the traceback)"))


def reject(context, idx: int, err: HandlerError) -> bytes:
    """The request's error status and body, in the shape its route's clients read."""
    context.set_response_status(err.status, status_phrase(err.message), idx)
    if routes.is_openai(openai_envelope.url_path(request_headers(context, idx))):
        context.set_response_content_type(idx, JSON)
        return error_body(err)  # OpenAI's clients read {"error": {...}}
    answer = {"code": err.status, "type": err.kind, "message": err.message}
    if kserve.from_kserve_route(request_headers(context, idx)):
        answer["error"] = err.message  # where KServe / Open Inference Protocol clients read it
    return json_answer(context, idx, answer)
