"""One corpus entry: a request, and the outcome it must get.

A case is *valid* (the model must answer 200 with a prediction) or *invalid* (a 4xx with a message
saying what is wrong). `layer` says who must refuse an invalid one: the handler (its JSON error
body {"code", "type", "message"}), or the TorchServe frontend before any worker sees it (request
over max_request_size, unknown model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from handlers.families.forecaster import QuantileForecaster
from handlers.families.image_classifier import ImageClassifier
from handlers.families.tensor import TensorModel
from handlers.families.text_embedder import TextEmbedder

# Cases are written for a family (handlers/families) and sent to every served model of it.
IMAGE, TEXT, TENSOR, FORECASTER = ImageClassifier.name, TextEmbedder.name, TensorModel.name, QuantileForecaster.name
HANDLER = "handler"
FRONTEND = "frontend"


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


def valid(name: str, family: str, body: bytes, content_type: Optional[str], source: str = "hand") -> Case:
    return Case(name, family, body, content_type, True, source=source)


def invalid(name: str, family: str, body: bytes, content_type: Optional[str], status: Optional[int] = None,
            words: str = "", layer: str = HANDLER, source: str = "hand") -> Case:
    return Case(name, family, body, content_type, False, status, words, layer, source)
