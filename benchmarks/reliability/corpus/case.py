"""One corpus entry: a request, and the outcome it must get.

A case is *valid* (the model must answer 200 with a prediction) or *invalid* (a 4xx with a message
saying what is wrong). `layer` says who must refuse an invalid one: the handler (its JSON error
body {"code", "type", "message"}), or the TorchServe frontend before any worker sees it (request
over max_request_size, unknown model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

IMAGE_MODEL = "efficientnet_lite0"
TEXT_MODEL = "minilm"
HANDLER = "handler"
FRONTEND = "frontend"


@dataclass(frozen=True)
class Case:
    name: str
    model: str
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
        return f"Case({self.name!r}, {self.model}, {len(self.body)} B, {self.content_type!r}, expect {self.expected})"


def valid(name: str, model: str, body: bytes, content_type: Optional[str], source: str = "hand") -> Case:
    return Case(name, model, body, content_type, True, source=source)


def invalid(name: str, model: str, body: bytes, content_type: Optional[str], status: Optional[int] = None,
            words: str = "", layer: str = HANDLER, source: str = "hand") -> Case:
    return Case(name, model, body, content_type, False, status, words, layer, source)


def worker_input(body: bytes, content_type: Optional[str]) -> Any:
    """The value a TorchServe 0.12 worker hands the handler for this body (ts/protocol/
    otf_message_handler._retrieve_input_data): exactly "application/json" is parsed as JSON, any
    "text..." type decoded as UTF-8, each falling back to the raw bytes when that fails."""
    ctype = content_type or ""
    if ctype == "application/json":
        try:
            return json.loads(body.decode("utf-8"))
        except Exception:  # noqa: BLE001 - TorchServe catches everything here too
            return body
    if ctype.startswith("text"):
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            return body
    return body
