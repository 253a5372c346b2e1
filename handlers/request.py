"""One request as everything after the door sees it: a record built once, from what the engine
adapter read of it (handlers/engines/), and never from the engine again.

Its headers are case-folded once (names lower case, values text); its route (plain /predictions,
KServe v1 / Open Inference Protocol v2, OpenAI), media type, body, deadline and trace parent are
decided here. The body is what the engine passed: bytes, text, or JSON the engine parsed already;
`json` parses a JSON body at most once, for whichever policy or protocol asks first.

Routes show in two headers TorchServe's frontend adds: `explain` on the REST routes (/predictions,
/explanations and the KServe routes; a request without it came over gRPC) and `url_path` on
/predictions and /explanations only. So `explain` without `url_path` is a KServe route, and a
`url_path` under `v1/` is one of OpenAI's (the rest of the path after /predictions/<model>/<version>).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Optional

from handlers.deadlines import Arrival, Due, due_of
from handlers.errors import BadInput, HandlerError

PLAIN = "plain"  # /predictions/<model>
KSERVE = "kserve"  # /v1/models/<m>:predict and /v2/models/<m>/infer
OPENAI = "openai"  # /predictions/<model>/<version>/v1/...


def json_value(body: Any) -> Any:
    """A JSON body, whatever form it arrived in: TorchServe's worker parses a body sent as exactly
    `application/json` itself, and hands any other (with a charset parameter, say, or one its own
    parse failed on) over as bytes. Raises BadInput naming what is wrong."""
    if not isinstance(body, (bytes, bytearray, str)):
        return body
    try:
        text = body if isinstance(body, str) else bytes(body).decode("utf-8")
        return json.loads(text)
    except UnicodeDecodeError as err:
        raise BadInput(f"body: not UTF-8 ({err.reason} at byte {err.start})") from None
    except RecursionError:
        raise BadInput("body: JSON nested too deep") from None
    except ValueError as err:
        raise BadInput(f"body: malformed JSON ({err})"[:200]) from None


def fold_headers(raw: Optional[Mapping[Any, Any]]) -> Mapping[str, str]:
    """Header names lower case, values text (an engine may hand them over as bytes)."""
    folded = {}
    for name, value in (raw or {}).items():
        text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
        folded[str(name).lower()] = text
    return MappingProxyType(folded)


def is_openai_path(url_path: str) -> bool:
    return url_path == "v1" or url_path.startswith("v1/")


@dataclass(frozen=True)
class Request:
    """One request of a batch, decided once at the door."""

    index: int  # its place in the engine's batch: where its answer goes
    request_id: Optional[str]
    headers: Mapping[str, str]  # names lower case
    body: Any  # bytes, text, or JSON the engine parsed already
    media_type: str  # lower case, without parameters ("" when none was sent)
    route: str  # PLAIN | KSERVE | OPENAI
    url_path: str  # what followed /predictions/<model>/<version>/ ("v1/embeddings"), stripped of slashes
    rest: bool  # came over REST; False: over gRPC
    due: Optional[Due] = None  # its deadline, when it has one
    error: Optional[HandlerError] = None  # what refuses it at the door (a form of several fields, a bad deadline)

    def header(self, name: str) -> Optional[str]:
        """A header by its lower-case name."""
        return self.headers.get(name)

    @property
    def no_cache(self) -> bool:
        """The client asked for a fresh answer (Cache-Control: no-cache)."""
        return "no-cache" in self.headers.get("cache-control", "").lower()

    @property
    def priority(self) -> Optional[str]:
        return self.headers.get("x-priority")

    @property
    def trace_headers(self) -> dict[str, str]:
        """W3C trace context: the caller's span, when it sent one."""
        return {name: self.headers[name] for name in ("traceparent", "tracestate") if self.headers.get(name)}

    @functools.cached_property
    def json(self) -> Any:
        """The body as JSON, parsed at most once: a JSON value the engine parsed, or bytes / text parsed
        here. Raises BadInput when it is not JSON (the caller decides what that means)."""
        return json_value(self.body)

    @property
    def parsed_body(self) -> Any:
        """The body as a family's decode should take it: the parsed JSON when something already
        parsed it here (so it is never parsed twice), else the body as the engine passed it."""
        return self.__dict__.get("json", self.body)


def open_request(index: int, request_id: Optional[str], raw_headers: Optional[Mapping[Any, Any]], body: Any,
                 arrival: Arrival, default_deadline_ms: Optional[int], error: Optional[HandlerError] = None) -> Request:
    """The record for one request: what an engine adapter calls once per request of a batch.
    `default_deadline_ms`: the model's deadline (0: none); None: deadlines are not read at all."""
    headers = fold_headers(raw_headers)
    url_path = headers.get("url_path")
    if url_path is not None and is_openai_path(url_path.strip("/")):
        route = OPENAI
    elif "explain" in headers and url_path is None:
        route = KSERVE
    else:
        route = PLAIN
    media_type = headers.get("content-type", "").split(";")[0].strip().lower()
    due = None
    if default_deadline_ms is not None:
        try:
            due = due_of(headers, default_deadline_ms, arrival)
        except BadInput as err:  # a malformed deadline header refuses the request before anything else
            error = err
    return Request(index, request_id, headers, body, media_type, route, (url_path or "").strip("/"),
                   "explain" in headers, due, error)
