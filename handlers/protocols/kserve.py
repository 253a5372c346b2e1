"""KServe v1 and the Open Inference Protocol v2 on TorchServe's KServe routes (handlers/kserve.py
reads and writes their bodies). A request on a KServe route whose body is a JSON object with neither
"instances" nor "inputs" is a /predictions request, answered as one; every error on these routes
also carries `error`, where KServe's clients read it."""

from __future__ import annotations

from typing import Any, Optional

from handlers import binary_tensors, kserve
from handlers.encoding import JSON, json_bytes
from handlers.errors import BadInput, HandlerError, UnsupportedMediaType
from handlers.protocols import Protocol, Reply, Unwrapped, error_reply


class KServeRoute(Protocol):
    """What answers a request on a KServe route: v1, v2, or the plain answer (see the module's docstring)."""

    name = "kserve"

    def __init__(self, input_kind: str, model_name: str) -> None:
        self.input_kind = input_kind
        self.v1 = KServeV1(model_name)
        self.v2 = OpenInferenceV2(model_name)

    def unwrap(self, request) -> Unwrapped:
        encoding = request.header("content-encoding")
        if encoding is not None and encoding.strip().lower() not in ("", "identity"):
            raise UnsupportedMediaType(f"Content-Encoding: {encoding[:40]!r}: compressed request bodies are not "
                                       "supported (TorchServe passes them on compressed); send it uncompressed")
        body = request.body
        declared = request.header(binary_tensors.HEADER.lower())
        if declared is not None:  # the binary tensor extension: a JSON header, then raw tensor bytes
            payload, tail = binary_tensors.split(body, declared)
            if "inputs" not in payload:
                raise BadInput(f'{binary_tensors.HEADER}: binary tensors are an Open Inference Protocol v2 '
                               'request\'s: its JSON header needs "inputs"')
        else:
            payload, tail = _json_object(request), None
        if payload is None:
            if isinstance(body, (bytes, bytearray, str, list)):  # never read as some family's text or bytes
                raise BadInput('body: a KServe route takes a JSON object, {"instances": [...]} (v1) or {"inputs": '
                               '[...]} (Open Inference Protocol v2; binary tensors follow a JSON header whose length '
                               f"is in the {binary_tensors.HEADER} request header)")
            return Unwrapped(self, ((body, request.media_type),))
        envelope = kserve.unwrap_payload(payload, self.input_kind, tail)
        if envelope is None:
            return Unwrapped(self, ((body, request.media_type),))  # as /predictions would take it
        return Unwrapped(self.v1 if envelope.protocol == "v1" else self.v2, envelope.bodies, state=envelope)

    def wrap(self, unwrapped: Unwrapped, answers: list[Any], tokens: Optional[list[int]] = None) -> Reply:
        return Reply(json_bytes(answers[0]), JSON)

    def error(self, err: HandlerError) -> Reply:
        return kserve_error(err)


class KServeV1(Protocol):
    name = "kserve-v1"

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    def wrap(self, unwrapped: Unwrapped, answers: list[Any], tokens: Optional[list[int]] = None) -> Reply:
        body, media_type, headers = kserve.encoded(unwrapped.state, answers, self.model_name)
        return Reply(body, media_type, headers)

    def error(self, err: HandlerError) -> Reply:
        return kserve_error(err)

    def instance_error(self, err: HandlerError, index: int) -> HandlerError:
        return kserve.instance_error(err, index)


class OpenInferenceV2(KServeV1):
    name = "oip-v2"


def kserve_error(err: HandlerError) -> Reply:
    # `error`: where KServe / Open Inference Protocol clients read it.
    return error_reply({"code": err.status, "type": err.kind, "message": err.message, "error": err.message}, err)


def _json_object(request) -> Optional[dict]:
    """The body as a JSON object: TorchServe parses `application/json` bodies already; any other
    content type arrives as bytes or text, parsed (once, by the record) only when it looks like an object."""
    body = request.body
    if isinstance(body, dict):
        return body
    if isinstance(body, (bytes, bytearray)):
        if not bytes(body[:64]).lstrip().startswith(b"{"):
            return None
    elif not isinstance(body, str) or not body.lstrip().startswith("{"):
        return None
    try:
        parsed = request.json
    except BadInput:  # not JSON after all: the family says what is wrong with it
        return None
    return parsed if isinstance(parsed, dict) else None
