"""Example requests of a catalogue entry: what every tool sends the model (the in-process benchmark,
the load generator, the tuner, soak and overload, the valid half of the reliability corpus) and
what the build tries once before archiving.

    examples:
      - {package: skimage, file: data/coffee.png, jpeg_quality: 90, expect: {top1: [espresso]}}
      - {path: examples/digits/zero.npy}             # content type from the suffix
      - {json: {text: "A man is eating food."}}
      - {text: "plain text body"}

`jpeg_quality` re-encodes an image file as a JPEG (as clients usually send photos); `expect.top1`
lists the labels a correct top-1 answer may be.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from build.errors import CatalogueError
from build.files import FileSource, only_keys

CONTENT_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".npy": "application/x-npy",
                 ".json": "application/json", ".txt": "text/plain"}
_KEYS = ("path", "package", "file", "content_type", "jpeg_quality", "json", "text", "expect")


@dataclass(frozen=True)
class Request:
    """One request as it goes over HTTP."""

    body: bytes
    content_type: str


@dataclass(frozen=True)
class Example:
    file: Optional[FileSource]
    inline: Any  # the JSON value or the text, when there is no file
    content_type: str
    jpeg_quality: Optional[int]
    top1: tuple[str, ...]  # labels a correct top-1 answer may be (empty: not checked)

    @property
    def name(self) -> str:
        return self.file.name if self.file else json.dumps(self.inline)[:40]

    def request(self, root: Path) -> Request:
        if self.file is None:
            data = self.inline.encode("utf-8") if self.content_type == "text/plain" else json.dumps(self.inline).encode()
            return Request(data, self.content_type)
        data = self.file.resolve(root, f"example {self.name}").read_bytes()
        if self.jpeg_quality is None:
            return Request(data, self.content_type)
        from PIL import Image

        out = io.BytesIO()
        Image.open(io.BytesIO(data)).convert("RGB").save(out, format="JPEG", quality=self.jpeg_quality)
        return Request(out.getvalue(), "image/jpeg")


def parse_example(where: str, raw: Any) -> Example:
    only_keys(where, raw, _KEYS)
    inline_keys = [key for key in ("json", "text") if key in raw]
    has_file = any(key in raw for key in ("path", "package", "file"))
    if len(inline_keys) + has_file != 1:
        raise CatalogueError(f"{where}: give one of a file (path, or package + file), 'json' or 'text'")
    expect = raw.get("expect") or {}
    only_keys(f"{where}.expect", expect, ("top1",))
    top1 = expect.get("top1", [])
    if not isinstance(top1, list) or not all(isinstance(label, str) for label in top1):
        raise CatalogueError(f"{where}.expect.top1: a list of labels")
    quality = raw.get("jpeg_quality")
    if quality is not None and (not isinstance(quality, int) or not 1 <= quality <= 95):
        raise CatalogueError(f"{where}.jpeg_quality: an integer in 1..95, got {quality!r}")
    if has_file:
        file = FileSource.parse(where, {k: raw[k] for k in ("path", "package", "file") if k in raw})
        suffix = Path(file.name).suffix.lower()
        content_type = raw.get("content_type", CONTENT_TYPES.get(suffix))
        if content_type is None:
            raise CatalogueError(f"{where}.content_type: needed for a {suffix or 'suffix-less'} file")
        return Example(file, None, str(content_type), quality, tuple(top1))
    if quality is not None:
        raise CatalogueError(f"{where}.jpeg_quality: only for image files")
    kind = inline_keys[0]
    if kind == "text" and not isinstance(raw["text"], str):
        raise CatalogueError(f"{where}.text: a string")
    default = "application/json" if kind == "json" else "text/plain"
    return Example(None, raw[kind], str(raw.get("content_type", default)), None, tuple(top1))


def parse_examples(where: str, raw: Any) -> tuple[Example, ...]:
    if not isinstance(raw, list):
        raise CatalogueError(f"{where}: expected a list of requests")
    return tuple(parse_example(f"{where}[{i}]", item) for i, item in enumerate(raw))


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


def requests(examples: Sequence[Example], root: Path) -> tuple[Request, ...]:
    return tuple(example.request(root) for example in examples)


def expected_top1(example: Example, answer: Mapping[str, Any]) -> Optional[str]:
    """What is wrong with a classifier's answer to this example ({label: probability} or
    {"class": label}), or None."""
    if not example.top1:
        return None
    if not isinstance(answer, Mapping) or not answer:
        return f"{example.name}: expected a {{label: probability}} answer, got {str(answer)[:80]}"
    best = answer["class"] if set(answer) == {"class"} else max(answer, key=answer.get)
    return None if best in example.top1 else f"{example.name}: top-1 {best!r}, expected one of {list(example.top1)}"
