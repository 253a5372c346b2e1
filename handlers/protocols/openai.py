"""OpenAI's routes on an archive batched by the engine: `v1/embeddings` for a family that answers
embeddings, `v1/models` for any. An embeddings request's texts are checked by the family once, here,
and become items of the batch's one forward pass; their token counts come from that pass's own
tokenisation (Family.item_tokens). The family says which endpoints it serves
(`Family.openai_endpoints`); a generating family's routes are served by its async service."""

from __future__ import annotations

from typing import Any, Optional

from handlers.encoding import JSON
from handlers.errors import HandlerError
from handlers.openai import routes
from handlers.openai.embeddings import embeddings_response, parse_embeddings
from handlers.openai.errors import error_body
from handlers.openai.models import model_response, models_response
from handlers.protocols import Protocol, Reply, Unwrapped


class OpenAI(Protocol):
    name = "openai"
    wants_tokens = True

    def __init__(self, family: Any, model_name: str, created: int) -> None:
        """`created`: when the model was loaded (Unix seconds)."""
        self.family = family
        self.model_name = model_name
        self.created = created

    def unwrap(self, request) -> Unwrapped:
        """The request's texts, or its models answer; OpenAIError when the route or the body is wrong."""
        route = routes.route(request.url_path, self.family.openai_endpoints)
        if route.endpoint == routes.MODELS:
            return Unwrapped(self, state=models_response(self.model_name, self.created))
        if route.endpoint == routes.MODEL:
            return Unwrapped(self, state=model_response(route.model, self.model_name, self.created))
        call = parse_embeddings(request.json, self.model_name,
                                check=lambda text: self.family.decode(text, "text/plain"))
        return Unwrapped(self, decoded=call.texts, state=call)

    def wrap(self, unwrapped: Unwrapped, answers: list[Any], tokens: Optional[list[int]] = None) -> Reply:
        """The answer in OpenAI's shape: the embeddings of the request's texts, or its models list."""
        if isinstance(unwrapped.state, bytes):
            return Reply(unwrapped.state, JSON)
        call = unwrapped.state
        return Reply(embeddings_response([answer["embedding"] for answer in answers], call.model, sum(tokens or ()),
                                         call.encoding_format), JSON)

    def error(self, err: HandlerError) -> Reply:
        return Reply(error_body(err), JSON, status=err.status, message=err.message)  # {"error": {...}}
