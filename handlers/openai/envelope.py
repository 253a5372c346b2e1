"""OpenAI's routes on an archive batched by TorchServe's frontend: `v1/embeddings` for a family
that answers embeddings, `v1/models` for any. A request on one of them becomes an Envelope, as a
KServe request does (handlers/kserve.py): its texts are items of the batch's one forward pass, and
its answer is wrapped in OpenAI's shape. The family says which endpoints it serves
(`Family.openai_endpoints`); a generating family's routes are served by its async service."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Optional

from handlers.kserve import Envelope, header
from handlers.openai import routes
from handlers.openai.embeddings import embeddings_response, parse_embeddings
from handlers.openai.models import model_response, models_response
from handlers.request_parts import json_value

PROTOCOL = "openai"


def url_path(headers: Optional[Mapping[str, Any]]) -> str:
    return (header(headers, "url_path") or "").strip("/")


def unwrap(body: Any, headers: Optional[Mapping[str, Any]], family: Any, model_name: str,
           created: int) -> Optional[Envelope]:
    """The request's texts when it came in on an OpenAI route (None: not one); OpenAIError when the
    route or the body is wrong. `created`: when the model was loaded (Unix seconds)."""
    path = url_path(headers)
    if not routes.is_openai(path):
        return None
    route = routes.route(path, family.openai_endpoints)
    if route.endpoint == routes.MODELS:
        return Envelope(PROTOCOL, (), extra=MappingProxyType({"answer": models_response(model_name, created)}))
    if route.endpoint == routes.MODEL:
        answer = model_response(route.model, model_name, created)
        return Envelope(PROTOCOL, (), extra=MappingProxyType({"answer": answer}))
    call = parse_embeddings(json_value(body), model_name, check=lambda text: family.decode(text, "text/plain"))
    tokens = sum(family.count_tokens(text) for text in call.texts)
    return Envelope(PROTOCOL, tuple((text, "text/plain") for text in call.texts),
                    extra=MappingProxyType({"call": call, "tokens": tokens}))


def wrap(envelope: Envelope, answers: list[Any]) -> bytes:
    """The answer in OpenAI's shape: the embeddings of the request's texts, or its models list."""
    if "answer" in envelope.extra:
        return envelope.extra["answer"]
    call = envelope.extra["call"]
    return embeddings_response([answer["embedding"] for answer in answers], call.model, envelope.extra["tokens"],
                               call.encoding_format)
