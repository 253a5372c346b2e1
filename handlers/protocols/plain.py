"""/predictions/<model>: the body is the request's one item, its answer goes back as JSON."""

from __future__ import annotations

from typing import Any, Optional

from handlers.encoding import JSON, json_bytes
from handlers.protocols import Protocol, Reply, Unwrapped


class Plain(Protocol):
    name = "plain"

    def __init__(self, input_kind: str) -> None:
        """`input_kind`: the family's (handlers/families/base.py); a family of binary input is given
        its body as sent, any other the JSON the record parsed already, when it did."""
        self.binary = input_kind == "bytes"

    def unwrap(self, request) -> Unwrapped:
        body = request.body if self.binary else request.parsed_body
        return Unwrapped(self, ((body, request.media_type),))

    def wrap(self, unwrapped: Unwrapped, answers: list[Any], tokens: Optional[list[int]] = None) -> Reply:
        return Reply(json_bytes(answers[0]), JSON)
