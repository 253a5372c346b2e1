"""The bad-input corpus: malformed and edge-case requests, each with the outcome it must get.

    from benchmarks.reliability.corpus import family_cases
    for case in family_cases("image_classifier"):      # built on call, nothing at import
        case.family, case.body, case.content_type, case.valid, case.expected

Cases are written per family (handlers/families) and go to every served model of that family; a
tensor model's are made from its declared shape, dtype and range (tensors.py), a forecaster's from
its window, horizon and limits (forecasts.py).

Hand-written cases (benchmarks/reliability/corpus/images.py, texts.py) say why they exist in their names; generated
ones (generated.py) come from a fixed seed. Valid edge cases (greyscale, CMYK, alpha, 16-bit, 1x1,
extreme aspect ratios, unicode, control characters inside words) must be answered 200; everything
else a 4xx with a message. `server_cases` depend on the server's max_request_size and are mostly
refused by TorchServe itself before any worker sees them (over max_request_size, unknown model):
they only make sense against a real server.
"""

from __future__ import annotations

from typing import Any, List, Optional

from benchmarks.reliability.corpus import forecasts, generated, images, tensors, texts
from benchmarks.reliability.corpus.case import (
    FORECASTER,
    FRONTEND,
    HANDLER,
    IMAGE,
    TENSOR,
    TEXT,
    Case,
)

# TorchServe's default max_request_size (bytes): what the frontend accepts when config.properties
# does not say otherwise.
DEFAULT_MAX_REQUEST_BYTES = 6_553_500

__all__ = ["Case", "family_cases", "server_cases", "HANDLER", "FRONTEND", "IMAGE", "TEXT", "TENSOR",
           "FORECASTER", "DEFAULT_MAX_REQUEST_BYTES"]


def family_cases(family: str, settings: Any = None) -> List[Case]:
    """Everything a model of this family sees and must answer itself (valid, or a 4xx of its
    own); `settings`: the model's family settings (a tensor model's cases are made from them)."""
    if family == TENSOR:
        return tensors.cases(settings)
    if family == FORECASTER:
        return forecasts.cases(settings)
    hand = {IMAGE: images.cases, TEXT: texts.cases}.get(family)
    if hand is None:
        return []
    found = hand() + [c for c in generated.cases() if c.family == family]
    names = [c.name for c in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"corpus case names must be unique per family: {duplicates}")
    return found


def server_cases(family: str, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 handler_limit: Optional[int] = None) -> List[Case]:
    """Bodies the limits refuse, for a model of `family`: over max_request_size the frontend
    answers 413 before any worker sees it; over the family's own `max_body_bytes` (handler_limit)
    the handler does, unless the frontend's limit is lower."""
    over = max_request_bytes + 1
    out = [Case("body over max_request_size", family, b"\xff\xd8" + b"\0" * (over - 2), "application/octet-stream",
                False, 413, "", FRONTEND)]
    if handler_limit is not None and handler_limit < max_request_bytes:
        body = b"\xff\xd8" + b"\0" * (handler_limit - 1)
        ctype = "image/jpeg" if family == IMAGE else "text/plain" if family == TEXT else "application/json"
        out.append(Case("body over the handler's own limit", family, body, ctype, False, 413, "", HANDLER))
    return out
