"""One HTTP/1.1 exchange over a plain socket, the reply checked byte for byte: what a lenient client
(requests reads Content-Length bytes and drops the rest) would not notice.

The reply must be a status line `HTTP/1.x NNN reason` whose reason holds no control character, header
lines `name: value` without control characters, and a body whose length is what Content-Length says
(or well-formed chunks), all before the timeout.
"""

from __future__ import annotations

import re
import socket
import time
from urllib.parse import urlsplit

_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})(?: ([^\x00-\x08\x0a-\x1f\x7f]*))?")
_HEADER = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):([^\x00-\x08\x0a-\x1f\x7f]*)")
SETTLE_S = 0.3  # after a complete body, how long extra bytes are waited for


class MalformedReply(ValueError):
    """The bytes that came back are not one valid HTTP reply."""


def exchange(base_url: str, path: str, body: bytes, headers: dict[str, str], timeout_s: float) -> tuple[int, dict, bytes]:
    """POST `body` to `path` with `headers` (Connection: close); (status, headers lower-cased, body)."""
    url = urlsplit(base_url)
    lines = [f"POST {path} HTTP/1.1", f"Host: {url.netloc}", f"Content-Length: {len(body)}", "Connection: close",
             *(f"{k}: {v}" for k, v in headers.items())]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    deadline = time.monotonic() + timeout_s
    received, closed = b"", False
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(request)
        while True:
            parsed = _complete(received, closed)
            left = deadline - time.monotonic()
            if parsed is not None:
                left = min(left, SETTLE_S)
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:  # TorchServe resets the connection it closes after a 4xx
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    parsed = _complete(received, closed)
    if parsed is None:
        raise MalformedReply(f"no complete reply within {timeout_s:.0f} s ({len(received)} B: {received[:160]!r})")
    status, found, payload, extra = parsed
    if extra:
        raise MalformedReply(f"{len(extra)} bytes after the body its framing announced: {extra[:80]!r}")
    return status, found, payload


def _complete(data: bytes, closed: bool):
    """(status, headers, body, bytes beyond it) once the reply is complete; None while it is not;
    MalformedReply when it cannot be one. `closed`: the server has closed the connection."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    status_line, *header_lines = head.split(b"\r\n")
    matched = _STATUS.fullmatch(status_line)
    if matched is None:
        raise MalformedReply(f"not a status line: {status_line[:160]!r}")
    headers = {}
    for line in header_lines:
        field = _HEADER.fullmatch(line)
        if field is None:
            raise MalformedReply(f"not a header line: {line[:160]!r} (after {status_line[:120]!r})")
        headers[field.group(1).decode().lower()] = field.group(2).decode("latin-1").strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return _chunks(int(matched.group(1)), headers, rest)
    length = headers.get("content-length")
    if length is None:  # the body ends when the connection does
        return (int(matched.group(1)), headers, rest, b"") if closed else None
    if not length.isdigit():
        raise MalformedReply(f"Content-Length {length!r}")
    if len(rest) < int(length):
        return None
    return int(matched.group(1)), headers, rest[:int(length)], rest[int(length):]


def _chunks(status: int, headers: dict, rest: bytes):
    body, at = b"", 0
    while True:
        line_end = rest.find(b"\r\n", at)
        if line_end < 0:
            return None
        size_text = rest[at:line_end].split(b";")[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise MalformedReply(f"not a chunk size: {size_text[:40]!r}") from None
        start, end = line_end + 2, line_end + 2 + size
        if len(rest) < end + 2:
            return None
        if rest[end:end + 2] != b"\r\n":
            raise MalformedReply(f"a chunk of {size} bytes not followed by CRLF: {rest[end:end + 20]!r}")
        if size == 0:
            return status, headers, body, rest[end + 2:]
        body, at = body + rest[start:end], end + 2
