"""A request body's size in whatever form it arrived, and JSON read with its nesting bounded.

TorchServe hands a handler `application/json` bodies already parsed (a dict or list), `text/*` ones
as str and the rest as bytes; when its own parse fails (JSON nested past Python's recursion limit,
say) the bytes come through instead. So a byte limit that only looks at bytes lets any size of valid
JSON through: `body_size` measures every form, parsed JSON as compact JSON would write it (UTF-8
strings, no spaces), without writing it out, and stops counting once past the limit. It walks with
a stack of its own, so no nesting can exhaust Python's; JSON nested deeper than MAX_DEPTH is refused
on the way (400 naming the nesting), since the code after it, NumPy included, expects shallow values.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Optional

from handlers.errors import BadInput, PayloadTooLarge, UnsupportedMediaType

MAX_DEPTH = 64  # containers inside containers; NumPy's own limit on dimensions is 64
_SCALARS = frozenset({int, float, bool, type(None)})
_CHUNK = 4096  # numbers sized per orjson call: the early stop's granularity
_JSON_TYPES = ("application/json", "")


def too_deep() -> BadInput:
    return BadInput(f"JSON nested deeper than {MAX_DEPTH} levels: send a flatter body")


def body_size(body: Any, limit: Optional[int] = None) -> int:
    """The body's size in bytes: bytes as they are, text as UTF-8, parsed JSON as compact JSON.
    Once the count passes `limit` it stops: the answer is then some number over the limit.
    Raises BadInput when parsed JSON is nested deeper than MAX_DEPTH."""
    if isinstance(body, (bytes, bytearray)):
        return len(body)
    if isinstance(body, str):  # text TorchServe decoded (a JSON string would add its two quotes)
        return _text_size(body)
    budget = float("inf") if limit is None else limit
    size, stack = 0, [(body, 1)]
    while stack:
        value, depth = stack.pop()
        kind = type(value)
        if kind is str:
            size += _text_size(value) + 2
        elif kind is list or kind is dict:
            if depth > MAX_DEPTH:
                raise too_deep()
            size += 1 + max(len(value), 1)  # brackets and commas
            if kind is dict:
                size += len(value) + sum(map(_key_size, value))  # keys and colons
                values = list(value.values())
            else:
                values = value
            if set(map(type, values)) <= _SCALARS:  # numbers: no containers below, sized at C speed
                size += _scalars_size(values, budget - size)
            else:
                stack.extend((v, depth + 1) for v in values)
        else:
            size += _scalar_size(value)
        if size > budget:
            return size
    return size


def check_size(body: Any, limit: int, what: str = "body") -> None:
    """Refuse a body over `limit` bytes in any form (413), or parsed JSON nested too deep (400)."""
    size = body_size(body, limit)
    if size <= limit:
        return
    if isinstance(body, (bytes, bytearray, str)):
        raise PayloadTooLarge(f"{what} is {size} bytes, over the limit of {limit}")
    raise PayloadTooLarge(f"{what} holds more than {limit} bytes of JSON (measured compact, in UTF-8), over the "
                          f"limit of {limit}")


def parse_json(data: bytes) -> Any:
    """UTF-8 JSON bytes parsed, every failure a BadInput saying what is wrong (nesting named)."""
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise too_deep() from None
    except ValueError as err:  # not UTF-8, not JSON, or an integer over Python's 4300 digits
        raise BadInput(f"malformed JSON: {err}"[:300]) from None


def read_json(body: Any, content_type: str, limit: int, forms: str) -> Any:
    """A JSON request body in any form TorchServe hands it over, checked against `limit` bytes and
    MAX_DEPTH: bytes are parsed (only as JSON or with no content type: `forms` says what to send
    instead), parsed values are measured."""
    if isinstance(body, (bytes, bytearray)):
        check_size(body, limit)
        if content_type not in _JSON_TYPES:
            raise UnsupportedMediaType(f"content type {content_type!r} not supported: {forms}")
        body = parse_json(bytes(body))
        body_size(body, None)  # the nesting: Python's parser allows about a thousand levels
        return body
    check_size(body, limit)
    return body


def _text_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _key_size(key: Any) -> int:
    return _text_size(key) + 2 if type(key) is str else len(str(key)) + 2


def _scalar_size(value: Any) -> int:
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    if type(value) is float:
        return len(repr(value))
    return len(str(value))


def _scalars_size(values: list, budget: float) -> int:
    """Numbers (and true/false/null) as compact JSON writes them, less the commas between them."""
    dumps = _orjson_dumps()
    size = 0
    for start in range(0, len(values), _CHUNK):
        chunk = values[start:start + _CHUNK]
        try:
            size += len(dumps(chunk)) - len(chunk) - 1  # less its brackets and commas
        except (TypeError, ValueError):  # orjson: an integer past 64 bits; or no orjson
            size += sum(map(_scalar_size, chunk))
        if size > budget:
            break
    return size


@functools.lru_cache(maxsize=1)
def _orjson_dumps():
    try:
        import orjson
    except ImportError:  # optional: Python's own sizes, one value at a time
        return _no_orjson
    return orjson.dumps


def _no_orjson(values: list) -> bytes:
    raise TypeError("orjson is not installed")
