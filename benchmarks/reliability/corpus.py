"""The bad-input corpus: each served model gets its family's cases (`Family.bad_inputs`, written in
handlers/families/ beside the family), plus the bodies the size limits refuse.

    from benchmarks.reliability.corpus import family_cases
    for case in family_cases(settings.family, settings.family_settings):   # built on first call
        case.body, case.content_type, case.valid, case.expected

`server_cases` depend on the server's max_request_size and are mostly refused by TorchServe itself
before any worker sees them: they only make sense against a real server.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from handlers.families import family_class
from handlers.families.cases import FRONTEND, HANDLER, Case, invalid

# TorchServe's default max_request_size (bytes): what the frontend accepts when config.properties
# does not say otherwise.
DEFAULT_MAX_REQUEST_BYTES = 6_553_500

__all__ = ["Case", "family_cases", "server_cases", "HANDLER", "FRONTEND", "DEFAULT_MAX_REQUEST_BYTES"]


def family_cases(family: str, settings: Any) -> list[Case]:
    """Everything a model of this family sees and must answer itself (valid, or a 4xx of its own);
    `settings`: the model's family settings. An unknown family is an error (ConfigError). Built once
    per family and settings (an image corpus encodes dozens of images: seconds); the cases are frozen."""
    try:
        return list(_cases(family, settings))
    except TypeError:  # settings that cannot be a cache key: built on call
        return family_class(family).bad_inputs(settings)


@functools.lru_cache(maxsize=16)
def _cases(family: str, settings: Any) -> tuple[Case, ...]:
    return tuple(family_class(family).bad_inputs(settings))


def server_cases(family: str, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 handler_limit: Optional[int] = None) -> list[Case]:
    """Bodies the limits refuse, for a model of `family`: over max_request_size the frontend
    answers 413 before any worker sees it; over the family's own `max_body_bytes` (handler_limit)
    the handler does, unless the frontend's limit is lower."""
    over = max_request_bytes + 1
    out = [invalid("body over max_request_size", b"\xff\xd8" + b"\0" * (over - 2), "application/octet-stream",
                   413, "", FRONTEND)]
    if handler_limit is not None and handler_limit < max_request_bytes:
        body = b"\xff\xd8" + b"\0" * (handler_limit - 1)
        out.append(invalid("body over the handler's own limit", body, family_class(family).request_content_type,
                           413))
    return family_class(family).stamped(out)
