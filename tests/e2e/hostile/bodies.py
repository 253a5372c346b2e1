"""What a hostile client sends, as hypothesis strategies: each draws a `Body` (bytes, content type)
with the outcome the contract asks of it (tests/e2e/hostile/contract.py: REFUSE, ANSWER, EITHER).

Sources: the families' own cases (handlers/families/*_cases.py, their expected status and words),
mutations of valid requests (the catalogue's examples and the families' valid cases), random JSON
(deep nesting, huge numbers, booleans where numbers go, NaN, unicode, control characters), random
bytes under every content type, multipart and urlencoded forms, .npy files with odd dtypes and
headers, images of every mode and format. An expectation is only as strict as the mutation
allows: a number replaced by another number may still be valid (EITHER); a boolean, a string, a
non-finite number or a float32 overflow where a model input number went must be refused.
"""

from __future__ import annotations

import io
import json
import math
import struct
import zlib
from dataclasses import dataclass
from functools import cache
from typing import Any, Optional

import numpy as np
from hypothesis import strategies as st
from PIL import Image

from benchmarks.reliability.corpus import family_cases
from handlers.families import family_class
from handlers.families.cases import multipart
from tests.e2e.helpers import examples_of, settings_of
from tests.e2e.hostile.contract import ANSWER, EITHER, FRONTEND_500, REFUSE, Expect

JSON = "application/json"
NPY = "application/x-npy"
FLOAT32_MAX = float(np.finfo(np.float32).max)
# Families that refuse a field they do not know (the text embedder ignores extra fields).
STRICT_FIELDS = frozenset({"tensor", "quantile_forecaster", "causal_lm"})
# Keys whose numbers are the model's input tensor: a value float32 cannot hold must be refused.
INPUT_KEYS = frozenset({"inputs", "data", "history"})
# Every field a family, KServe or OpenAI knows: an "unknown field" is none of these.
KNOWN_KEYS = frozenset({
    "inputs", "data", "shape", "dtype", "history", "horizon", "thresholds", "alert_within", "series", "text",
    "prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "stream", "ignore_eos", "id",
    "parameters", "instances", "outputs", "model", "messages", "max_tokens", "max_completion_tokens", "n",
    "stream_options", "user", "input", "encoding_format", "dimensions", "name", "datatype", "metadata",
})
CONTENT_TYPES = (JSON, "application/json; charset=utf-8", "text/plain", "text/plain; charset=utf-8", NPY,
                 "image/jpeg", "image/png", "image/gif", "application/octet-stream", "application/xml",
                 "text/csv", "*/*", "application/json; charset=latin-1", "", None)

# Every code point, unpaired surrogates included (JSON carries them as \udXXX escapes).
ANY_CHAR = st.characters(exclude_categories=()) | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
# What error messages may have to carry back: non-ASCII, CR/LF, NUL, controls, right-to-left.
NAME_CHARS = st.sampled_from("é\r\n\x00\x07\x1b\t\"'\\:%日ñ\u202e\U0001f600") | ANY_CHAR


@dataclass(frozen=True)
class Body:
    """One request body and what the contract expects of it."""

    label: str
    data: bytes
    content_type: Optional[str]
    expect: Expect
    instances: tuple[int, ...] = ()  # the examples it carries when valid: a 200 must hold their answers
    headers: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:  # hypothesis prints falsifying examples: keep them readable
        extra = f", headers {dict(self.headers)}" if self.headers else ""
        return f"Body({self.label!r}, {self.content_type!r}{extra}, {len(self.data)} B: {self.data[:160]!r}, {self.expect})"


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()  # NaN/Infinity as Python writes them; surrogates escaped


# ---- values ------------------------------------------------------------------------------------------
OVERFLOWS = st.sampled_from([1e39, -1e39, 3.5e38, 1e308, -1e308, 10**40, -(10**40), 10**400, 2**64])
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
           | OVERFLOWS | st.text(ANY_CHAR, max_size=24))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(ANY_CHAR, max_size=8), inner, max_size=4), max_leaves=16)


@st.composite
def nested(draw) -> Any:
    """A scalar inside 2 to 64 lists."""
    value = draw(SCALARS)
    for _ in range(draw(st.integers(2, 64))):
        value = [value]
    return value


HOSTILE_VALUES = st.one_of(st.booleans(), st.none(), NON_FINITE, OVERFLOWS, st.text(ANY_CHAR, max_size=12),
                           st.integers(-(2**70), 2**70), st.floats(allow_nan=False), nested(), JSON_VALUES)
FIELD_NAMES = st.text(NAME_CHARS, min_size=1, max_size=12).filter(lambda n: n not in KNOWN_KEYS)


def simple_name(name: str) -> bool:
    """A field name a message must carry as it is (others may be escaped or shortened)."""
    return name.isascii() and name.isprintable() and len(name.strip()) == len(name) and 0 < len(name) <= 12


def words_naming(name: str) -> tuple[str, ...]:
    return (name,) if simple_name(name) else ()


# ---- the families' own requests --------------------------------------------------------------------
def family_of(model: str) -> str:
    return settings_of(model).family


@cache
def _cases(model: str) -> tuple:
    settings = settings_of(model)
    return tuple(family_cases(settings.family, settings.family_settings))


def cases(model: str) -> st.SearchStrategy[Body]:
    """The family's cases (handlers/families/*_cases.py), each with its own expected outcome."""
    out = []
    for case in _cases(model):
        expect = Expect(ANSWER) if case.valid else Expect(REFUSE, case.status, (case.words,) if case.words else ())
        out.append(Body(f"case: {case.name}", case.body, case.content_type, expect))
    return st.sampled_from(out)


@cache
def valid_bodies(model: str) -> tuple[tuple[bytes, Optional[str]], ...]:
    """The catalogue's examples and the family's valid cases: what mutations start from."""
    found = [(r.body, r.content_type) for _, r in examples_of(model)]
    found += [(c.body, c.content_type) for c in _cases(model) if c.valid and len(c.body) < 200_000]
    return tuple(found)


@cache
def json_documents(model: str) -> tuple[Any, ...]:
    docs = []
    for body, content_type in valid_bodies(model):
        if content_type in (JSON, None) or (content_type or "").startswith(JSON):
            try:
                doc = json.loads(body)
            except ValueError:
                continue
            if isinstance(doc, dict):
                docs.append(doc)
    return tuple(docs)


def _leaves(value: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in _leaves(item, (*path, key))]
    if isinstance(value, list) and value:
        return [leaf for i, item in enumerate(value) for leaf in _leaves(item, (*path, i))]
    return [path]


def _get(value: Any, path: tuple) -> Any:
    for step in path:
        value = value[step]
    return value


def _set(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _set(value[path[0]], path[1:], new)
    return copy


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def replaced_leaf_outcome(old: Any, new: Any, path: tuple) -> str:
    """REFUSE when the new value cannot be what the old one was; EITHER when it may still be valid."""
    if _is_number(old):
        if not _is_number(new) or (isinstance(new, float) and not math.isfinite(new)):
            return REFUSE
        if abs(new) > FLOAT32_MAX and INPUT_KEYS & {p for p in path if isinstance(p, str)}:
            return REFUSE  # finite in float64, infinite in the model's float32
        return EITHER
    if isinstance(old, (str, bool)) and type(new) is not type(old):
        return REFUSE
    return EITHER


@st.composite
def mutated_json(draw, model: str) -> Body:
    """A valid JSON request with one leaf replaced, one field added, one dropped, or the whole wrapped."""
    family = family_of(model)
    doc = draw(st.sampled_from(json_documents(model)))
    content_type = draw(st.sampled_from([JSON, JSON, JSON, None, "application/json; charset=utf-8", "text/plain"]))
    # A text family reads a body of another type as the text itself: only JSON must hold the fields.
    as_json = family_class(family).request_content_type == JSON or (content_type or "").startswith(JSON)
    how = draw(st.sampled_from(["leaf", "leaf", "leaf", "add", "drop", "wrap"]))
    if how == "leaf":
        path = draw(st.sampled_from(_leaves(doc)))
        new = draw(HOSTILE_VALUES)
        outcome = replaced_leaf_outcome(_get(doc, path), new, path) if as_json else EITHER
        return Body(f"{'/'.join(map(str, path))} := {new!r}"[:120], _dumps(_set(doc, path, new)), content_type,
                    Expect(outcome))
    if how == "add":
        name, value = draw(FIELD_NAMES), draw(JSON_VALUES)
        if family not in STRICT_FIELDS:
            return Body(f"unknown field {name!r}", _dumps({**doc, name: value}), content_type, Expect(EITHER))
        words = words_naming(name) if content_type in (JSON, None) else ()
        return Body(f"unknown field {name!r}", _dumps({**doc, name: value}), content_type, Expect(REFUSE, None, words))
    if how == "drop":
        key = draw(st.sampled_from(sorted(doc)))
        return Body(f"without {key!r}", _dumps({k: v for k, v in doc.items() if k != key}), content_type,
                    Expect(EITHER))
    wrapped = draw(st.sampled_from(["list", "object", "string"]))
    value = {"list": [doc], "object": {"request": doc}, "string": json.dumps(doc)}[wrapped]
    return Body(f"wrapped in a {wrapped}", _dumps(value), content_type, Expect(EITHER))


@st.composite
def mutated_bytes(draw, model: str) -> Body:
    """A valid request's bytes cut short, overwritten or spliced: anything may come of it but a fault."""
    data, content_type = draw(st.sampled_from(valid_bodies(model)))
    data = bytearray(data)
    how = draw(st.sampled_from(["cut", "flip", "insert"]))
    at = draw(st.integers(0, max(len(data) - 1, 0)))
    if how == "cut":
        data = data[:at]
    elif how == "flip" and data:
        for i in draw(st.lists(st.integers(at, max(at, len(data) - 1)), min_size=1, max_size=8)):
            data[i] = draw(st.integers(0, 255))
    else:
        data[at:at] = draw(st.binary(min_size=1, max_size=64))
    return Body(f"{how} at {at}", bytes(data), content_type, Expect(EITHER))


# ---- random bodies -----------------------------------------------------------------------------------
@st.composite
def deep_json(draw) -> Body:
    depth = draw(st.sampled_from([100, 1000, 5000, 100_000]))
    kind = draw(st.sampled_from(["lists", "objects"]))
    data = (b"[" * depth + b"]" * depth if kind == "lists"
            else b'{"text": ' * depth + b'"x"' + b"}" * depth)
    return Body(f"JSON {depth} {kind} deep", data, draw(st.sampled_from([JSON, None, "text/plain"])), Expect(EITHER))


@st.composite
def random_json(draw) -> Body:
    value = draw(JSON_VALUES)
    return Body("random JSON", _dumps(value), draw(st.sampled_from(CONTENT_TYPES)), Expect(EITHER))


@st.composite
def random_bytes(draw) -> Body:
    return Body("random bytes", draw(st.binary(max_size=4096)), draw(st.sampled_from(CONTENT_TYPES)), Expect(EITHER))


@st.composite
def forms(draw) -> Body:
    """multipart/form-data with one to four fields, or application/x-www-form-urlencoded pairs."""
    if draw(st.booleans()):
        names = draw(st.lists(st.text("abcdefghij_", min_size=1, max_size=6), min_size=1, max_size=4, unique=True))
        fields = {name: draw(st.binary(max_size=512) | st.just(b'{"text": "hello"}')) for name in names}
        data, content_type = multipart(fields)
        return Body(f"multipart, {len(fields)} field(s)", data, content_type, Expect(EITHER))
    pairs = draw(st.lists(st.tuples(st.text(ANY_CHAR, max_size=8), st.text(ANY_CHAR, max_size=16)), max_size=5))
    from urllib.parse import urlencode

    data = urlencode(pairs, encoding="utf-8", errors="surrogatepass").encode()
    # An empty field name never reaches a worker: TorchServe's form decoder answers it (docs/api.md#errors).
    expect = Expect(FRONTEND_500, words=("empty name",)) if any(not name for name, _ in pairs) else Expect(EITHER)
    return Body(f"urlencoded, {len(pairs)} pair(s)", data, "application/x-www-form-urlencoded", expect)


def anything(model: str) -> st.SearchStrategy[Body]:
    """Every REST strategy above, for one model."""
    strategies = [cases(model), mutated_bytes(model), random_json(), random_bytes(), deep_json(), forms()]
    if json_documents(model):
        strategies.insert(1, mutated_json(model))
    if family_of(model) == "tensor":
        strategies.append(odd_npy(tuple(settings_of(model).family_settings.shape)))
    if family_of(model) == "image_classifier":
        strategies += [any_image(), png_bomb()]
    return st.one_of(strategies)


# ---- .npy ----------------------------------------------------------------------------------------------
NPY_DTYPES = ("<c8", "<c16", "V8", "<U4", "S4", "|b1", "<M8[s]", "<m8[s]", "<f2", "<f8", ">f4", "|i1", "<u8",
              "<i8", "structured")
_STRUCTURED = [("a", "<f4"), ("b", "<i4")]
REFUSED_KINDS = frozenset("cVUSOMm")


def npy_header(descr: str, shape: tuple, fortran: bool = False) -> bytes:
    text = f"{{'descr': {descr!r}, 'fortran_order': {fortran}, 'shape': {tuple(shape)!r}, }}"
    pad = 64 - (10 + len(text) + 1) % 64
    text = text + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin-1")


@st.composite
def odd_npy(draw, shape: tuple) -> Body:
    """An .npy of the model's shape in an odd dtype, or a header that lies (huge, negative, junk)."""
    how = draw(st.sampled_from(["dtype", "dtype", "huge shape", "odd shape", "short data", "junk header"]))
    if how == "dtype":
        descr = draw(st.sampled_from(NPY_DTYPES))
        dtype = np.dtype(_STRUCTURED if descr == "structured" else descr)
        value = draw(st.sampled_from([0, 3, 16]))
        if dtype.kind in "US":
            array = np.full(shape, str(value), dtype)  # strings that read as numbers
        elif dtype.kind == "c":
            array = np.full(shape, complex(value, draw(st.sampled_from([0, 1]))), dtype)
        elif dtype.kind == "V":
            array = np.zeros(shape, dtype)
        else:
            array = np.full(shape, value).astype(dtype)
        out = io.BytesIO()
        np.save(out, array, allow_pickle=False)
        outcome = REFUSE if dtype.kind in REFUSED_KINDS else EITHER
        return Body(f".npy of {descr} ({value})", out.getvalue(), NPY, Expect(outcome))
    if how == "huge shape":
        declared = tuple(draw(st.lists(st.integers(10**5, 10**12), min_size=1, max_size=3)))
        return Body(f".npy declaring {declared}", npy_header("<f4", declared) + b"\0" * 256, NPY, Expect(REFUSE))
    if how == "odd shape":
        declared = tuple(draw(st.lists(st.integers(-3, 9), min_size=0, max_size=6)))
        outcome = EITHER if declared == shape else REFUSE
        count = max(0, int(np.prod(declared))) if declared else 1
        return Body(f".npy shape {declared}", npy_header("<f4", declared) + b"\0" * 4 * count, NPY, Expect(outcome))
    if how == "short data":
        return Body(".npy with its data cut", npy_header("<f4", shape) + b"\0" * draw(st.integers(0, 7)), NPY,
                    Expect(REFUSE))
    junk = draw(st.sampled_from(["__import__('os').system('true')", "{'descr': '<f4'}", "[1, 2]",
                                 "{'descr': '<f4', 'fortran_order': 1, 'shape': (1, 8, 8)}", "{"]))
    text = junk + "\n"
    return Body(f".npy header {junk!r}", b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode() + b"\0" * 256,
                NPY, Expect(REFUSE))


# ---- images ----------------------------------------------------------------------------------------
IMAGE_MODES = ("1", "L", "LA", "P", "RGB", "RGBA", "CMYK", "I;16", "I", "F")


@st.composite
def any_image(draw) -> Body:
    """A real image of any mode and size in any of PIL's formats: a JPEG or PNG must be answered."""
    fmt = draw(st.sampled_from(["PNG", "PNG", "JPEG", "JPEG", "GIF", "BMP", "WEBP", "TIFF"]))
    mode = draw(st.sampled_from(IMAGE_MODES))
    size = (draw(st.integers(1, 96)), draw(st.integers(1, 96)))
    seed = draw(st.integers(0, 2**16))
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    image = Image.fromarray(pixels, "RGB")
    try:
        image = image.convert(mode)
        out = io.BytesIO()
        image.save(out, format=fmt)
    except (OSError, ValueError, KeyError):  # a mode the format cannot hold: the RGB image instead
        mode, out = "RGB", io.BytesIO()
        Image.fromarray(pixels, "RGB").save(out, format=fmt)
    content_type = draw(st.sampled_from(["image/jpeg", "image/png", "application/octet-stream", None]))
    outcome = ANSWER if fmt in ("PNG", "JPEG") else REFUSE
    return Body(f"{fmt} {mode} {size[0]}x{size[1]}", out.getvalue(), content_type, Expect(outcome))


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


@st.composite
def png_bomb(draw) -> Body:
    """A PNG header declaring up to 2^31-1 pixels a side, with a few bytes of data."""
    width, height = draw(st.integers(1, 2**31 - 1)), draw(st.integers(1, 2**31 - 1))
    depth, colour = draw(st.sampled_from([(8, 2), (1, 0), (16, 6), (8, 3)]))
    header = _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0))
    data = b"\x89PNG\r\n\x1a\n" + header + _chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _chunk(b"IEND", b"")
    outcome = REFUSE if width * height > 50_000_000 else EITHER
    return Body(f"PNG declaring {width}x{height}", data, "image/png", Expect(outcome))
