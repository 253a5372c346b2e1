"""Read Java `.properties` files (the format of TorchServe's config.properties).

In the handler package because a worker reads its thread plan from the server's config.properties
(handlers/plan.py); serving/properties.py adds the writer.

Only what TorchServe's `java.util.Properties.load` understands and we need: `#`/`!` comments,
`key=value` / `key: value` / `key value`, backslash line continuation (leading whitespace of the
continued line dropped) and the usual backslash escapes.
"""

from __future__ import annotations

import re
from pathlib import Path

_SEPARATOR = re.compile(r"(?<!\\)(?:\\\\)*[=:\s]")
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    pending: str | None = None
    for raw in text.splitlines():
        line = raw.lstrip()
        if pending is None and (not line or line[0] in "#!"):
            continue
        # A line continues when it ends with an odd number of backslashes.
        trailing = len(line) - len(line.rstrip("\\"))
        continues = trailing % 2 == 1
        if continues:
            line = line[:-1]
        pending = line if pending is None else pending + line
        if not continues:
            lines.append(pending)
            pending = None
    if pending is not None:
        lines.append(pending)
    return lines


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 == len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u" and i + 6 <= len(text):
            out.append(chr(int(text[i + 2 : i + 6], 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def parse(text: str) -> dict[str, str]:
    """Key -> value, in file order; a repeated key keeps its last value (as Java does)."""
    props: dict[str, str] = {}
    for line in _logical_lines(text):
        match = _SEPARATOR.search(line)
        if match is None:
            key, value = line, ""
        else:
            key = line[: match.end() - 1]
            rest = line[match.end() - 1 :]
            # Separator: optional whitespace, at most one of '=' or ':', optional whitespace.
            rest = rest.lstrip(" \t\f")
            if rest[:1] in ("=", ":"):
                rest = rest[1:]
            value = rest.lstrip(" \t\f")
        props[_unescape(key)] = _unescape(value)
    return props


def read(path: Path) -> dict[str, str]:
    return parse(Path(path).read_text(encoding="utf-8"))
