"""TorchServe's `url_path` request header -> the OpenAI endpoint asked for.

TorchServe answers POST /predictions/<model>/<version>/<more> with the handler and puts <more> in
the `url_path` header, so an `openai` client whose base_url is
http://host:8080/predictions/<model>/<version>/v1 reaches the handler with url_path
"v1/chat/completions", "v1/completions", "v1/models", "v1/models/<id>" or "v1/embeddings".
A `v1/...` path this model does not serve is a 404 in OpenAI's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Optional

from handlers.openai.errors import OpenAIError

COMPLETIONS = "completions"
CHAT = "chat"
MODELS = "models"
MODEL = "model"  # v1/models/<id>
EMBEDDINGS = "embeddings"

ROUTES: Mapping[str, str] = MappingProxyType({
    "v1/completions": COMPLETIONS,
    "v1/chat/completions": CHAT,
    "v1/models": MODELS,
    "v1/embeddings": EMBEDDINGS,
})
_MODEL_PREFIX = "v1/models/"
GENERATION_ENDPOINTS: frozenset[str] = frozenset({COMPLETIONS, CHAT, MODELS, MODEL})
EMBEDDING_ENDPOINTS: frozenset[str] = frozenset({EMBEDDINGS, MODELS, MODEL})


@dataclass(frozen=True)
class Route:
    endpoint: str  # one of the names above
    model: Optional[str] = None  # v1/models/<id>: the id asked about


def is_openai(url_path: Optional[str]) -> bool:
    """Whether the request came in under .../v1/ (else it is a plain /predictions request)."""
    path = (url_path or "").strip("/")
    return path == "v1" or path.startswith("v1/")


def route(url_path: str, endpoints: frozenset[str]) -> Route:
    """The endpoint for `url_path`, among those this model serves (GENERATION_ENDPOINTS or
    EMBEDDING_ENDPOINTS); OpenAIError 404 for any other."""
    path = (url_path or "").strip("/")
    endpoint = ROUTES.get(path)
    if endpoint is not None and endpoint in endpoints:
        return Route(endpoint)
    if path.startswith(_MODEL_PREFIX) and MODEL in endpoints:  # stripped: the id is not empty
        return Route(MODEL, path[len(_MODEL_PREFIX):])
    served = ", ".join(f"/{p}" for p, e in ROUTES.items() if e in endpoints)
    raise OpenAIError(f"Invalid URL (/{path}): this model answers {served}"[:300], status=404)


STEP_MODE_HAS_NO_OPENAI = ("OpenAI's routes need the async mode: set causal_lm.mode: async in the catalogue "
                           "and rebuild (this archive answers /predictions only)")
