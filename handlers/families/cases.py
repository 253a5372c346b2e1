"""Requests a family's models must answer themselves, each with the outcome it must get.

A case is *valid* (the model must answer 200 with a well-formed answer) or *invalid* (a 4xx with a
message saying what is wrong). `layer` says who must refuse an invalid one: the handler (its JSON
error body {"code", "type", "message"}), or the TorchServe frontend before any worker sees it.
Each family writes its own cases (`Family.bad_inputs`); the reliability tools and the tests send
them to every served model of the family. Nothing here runs at import time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

HANDLER = "handler"
FRONTEND = "frontend"
JSON = "application/json"


@dataclass(frozen=True)
class Case:
    name: str
    family: str  # the family whose models get it (every served one); a frontend case: a model name
    body: bytes
    content_type: Optional[str]  # None: no Content-Type header at all
    valid: bool
    status: Optional[int] = None  # invalid cases: the exact status expected (None: any 4xx)
    words: str = ""  # invalid cases: expected in the error message (case-insensitive)
    layer: str = HANDLER
    source: str = "hand"  # "hand" (written for a reason) or "generated" (seeded random)

    def __post_init__(self) -> None:
        if self.valid and (self.status or self.words):
            raise ValueError(f"{self.name}: a valid case expects 200, not a status or message")
        if self.layer not in (HANDLER, FRONTEND):
            raise ValueError(f"{self.name}: layer must be {HANDLER!r} or {FRONTEND!r}")

    @property
    def expected(self) -> str:
        return "200" if self.valid else (str(self.status) if self.status else "4xx")

    @property
    def form_encoded(self) -> bool:
        """TorchServe's frontend splits form bodies into fields: only a real server shows the result."""
        ctype = (self.content_type or "").lower()
        return ctype.startswith(("multipart/form-data", "application/x-www-form-urlencoded"))

    def outcome_ok(self, status: int, message: str) -> bool:
        """Whether an answer (status, error message) is the one this case must get."""
        if self.valid:
            return status == 200
        if not 400 <= status < 500 or not message.strip():
            return False
        if self.status is not None and status != self.status:
            return False
        return self.words.lower() in message.lower()

    def __repr__(self) -> str:  # bodies can be megabytes: never print them
        return f"Case({self.name!r}, {self.family}, {len(self.body)} B, {self.content_type!r}, expect {self.expected})"


def valid(name: str, body: bytes, content_type: Optional[str], source: str = "hand") -> Case:
    """A request the model must answer 200 (its family is stamped by `Family.bad_inputs`)."""
    return Case(name, "", body, content_type, True, source=source)


def invalid(name: str, body: bytes, content_type: Optional[str], status: Optional[int] = None,
            words: str = "", layer: str = HANDLER, source: str = "hand") -> Case:
    """A request the model must refuse with `status` (any 4xx when None), `words` in the message."""
    return Case(name, "", body, content_type, False, status, words, layer, source)


def json_body(value: Any) -> bytes:
    """JSON bytes; NaN and Infinity written as Python's json reads them."""
    return json.dumps(value).encode()


def nested(value: Any, depth: int) -> Any:
    """`value` inside `depth` lists: JSON nested that deep."""
    for _ in range(depth):
        value = [value]
    return value


def multipart(fields: dict[str, bytes], boundary: str = "corpusboundary7MA4YWxk") -> tuple[bytes, str]:
    """A multipart/form-data body with the given fields (as `curl -F name=@file` sends)."""
    parts = []
    for name, value in fields.items():
        parts.append(
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}.bin\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n".encode() + value + b"\r\n"
        )
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def unique(cases: list[Case]) -> list[Case]:
    """The cases, refusing two with one name (reports and test ids name cases)."""
    names = [c.name for c in cases]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"case names must be unique per family: {duplicates}")
    return cases
