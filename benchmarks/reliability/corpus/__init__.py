"""The bad-input corpus: malformed and edge-case requests, each with the outcome it must get.

    from benchmarks.reliability.corpus import cases
    for case in cases():            # built on call, nothing at import
        case.model, case.body, case.content_type, case.valid, case.expected

Hand-written cases (benchmarks/reliability/corpus/images.py, texts.py) say why they exist in their names; generated
ones (generated.py) come from a fixed seed. Valid edge cases (greyscale, CMYK, alpha, 16-bit, 1x1,
extreme aspect ratios, unicode, control characters inside words) must be answered 200; everything
else a 4xx with a message. `server_cases` depend on the server's max_request_size and are mostly
refused by TorchServe itself before any worker sees them (over max_request_size, unknown model):
they only make sense against a real server.
"""

from __future__ import annotations

from typing import List, Tuple

from benchmarks.reliability.corpus import generated, images, texts
from benchmarks.reliability.corpus.case import FRONTEND, HANDLER, IMAGE_MODEL, TEXT_MODEL, Case, worker_input
from handlers.settings import ImageSettings

# TorchServe's default max_request_size (bytes): what the frontend accepts when config.properties
# does not say otherwise.
DEFAULT_MAX_REQUEST_BYTES = 6_553_500

__all__ = ["Case", "cases", "handler_cases", "server_cases", "worker_input", "HANDLER", "FRONTEND",
           "IMAGE_MODEL", "TEXT_MODEL", "DEFAULT_MAX_REQUEST_BYTES"]


def handler_cases() -> List[Case]:
    """Everything a handler sees and must answer itself (valid, or a 4xx of its own)."""
    return images.cases() + texts.cases() + generated.cases()


def server_cases(max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> List[Case]:
    over = max_request_bytes + 1
    image_limit = ImageSettings().max_body_bytes + 1
    return [
        # Refused by whichever limit is lower: the frontend's, or the image handler's own.
        Case("image body over the handler's limit", IMAGE_MODEL, b"\xff\xd8" + b"\0" * (image_limit - 2),
             "image/jpeg", False, 413, "", HANDLER if image_limit <= max_request_bytes else FRONTEND),
        Case("image body over max_request_size", IMAGE_MODEL, b"\xff\xd8" + b"\0" * (over - 2),
             "image/jpeg", False, 413, "", FRONTEND),
        Case("text body over max_request_size", TEXT_MODEL, b"a" * over, "text/plain", False, 413, "", FRONTEND),
        Case("json body at twice max_request_size", TEXT_MODEL, b'{"text": "' + b"b" * (2 * over) + b'"}',
             "application/json", False, 413, "", FRONTEND),
        Case("unknown model", "no_such_model", b"hello", "text/plain", False, 404, "", FRONTEND),
        Case("model name with path traversal", "..%2f..%2fetc%2fpasswd", b"hello", "text/plain", False, None, "",
             FRONTEND),
    ]


def cases(max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> Tuple[Case, ...]:
    """The whole corpus; names are unique per model."""
    everything = handler_cases() + server_cases(max_request_bytes)
    names = [f"{c.model}: {c.name}" for c in everything]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"corpus case names must be unique: {duplicates}")
    return tuple(everything)
