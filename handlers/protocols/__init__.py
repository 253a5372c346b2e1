"""The protocols a request may come in: each says what its items are (`unwrap`), how its answers go
back (`wrap`) and what its error body is (`error`). The route decided at the door
(handlers/request.py) picks the protocol; nothing re-derives it from headers.

    plain.py     /predictions/<model>: the body is one item, the answer goes back as it is
    kserve.py    KServe v1 and Open Inference Protocol v2 on TorchServe's KServe routes
    openai.py    OpenAI's routes on a request/response family: v1/embeddings, v1/models
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Optional

from handlers.encoding import JSON, json_bytes
from handlers.errors import HandlerError


@dataclass(frozen=True)
class Reply:
    """What goes back for one request: its body, content type, response headers, status and the
    message its reason phrase comes from."""

    body: bytes
    content_type: str = JSON
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    status: int = 200
    message: str = ""


@dataclass(frozen=True)
class Unwrapped:
    """One request unwrapped: the protocol that answers it, what its family decodes (one body and
    media type per item) or the items already decoded, and what its answer needs beside them."""

    protocol: Any  # a Protocol
    bodies: tuple[tuple[Any, str], ...] = ()
    decoded: Optional[tuple[Any, ...]] = None  # items its protocol checked itself (OpenAI's texts)
    state: Any = None

    @property
    def count(self) -> int:
        return len(self.decoded) if self.decoded is not None else len(self.bodies)


class Protocol:
    """unwrap(request) -> Unwrapped; wrap(unwrapped, answers, tokens) -> Reply; error(err) -> Reply."""

    name = ""
    wants_tokens = False  # wrap needs each item's token count (OpenAI's usage)

    def unwrap(self, request) -> Unwrapped:
        raise NotImplementedError

    def wrap(self, unwrapped: Unwrapped, answers: list[Any], tokens: Optional[list[int]] = None) -> Reply:
        raise NotImplementedError

    def error(self, err: HandlerError) -> Reply:
        return error_reply({"code": err.status, "type": err.kind, "message": err.message}, err)

    def instance_error(self, err: HandlerError, index: int) -> HandlerError:
        """A family's rejection of one of several items, for the whole request."""
        return err


def error_reply(body: Any, err: HandlerError) -> Reply:
    return Reply(json_bytes(body), JSON, status=err.status, message=err.message)
