"""The text embedder's cases: every way a client may send a sentence (valid), broken bodies, and
seeded generated ones (random bytes, random wrong JSON, broken UTF-8, control characters)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from handlers.families.cases import Case, invalid, multipart, nested, valid

JSON = "application/json"
PLAIN = "text/plain"
SENTENCE = "A cat is sleeping on the warm windowsill while the sun sets behind the hills."


def _ok(name: str, body: bytes, content_type: str | None = PLAIN) -> Case:
    return valid(name, body, content_type)


def _bad(name: str, body: bytes, status: int = 400, words: str = "", content_type: str | None = JSON) -> Case:
    return invalid(name, body, content_type, status, words)


def _json(value) -> bytes:
    return json.dumps(value).encode()



def valid_texts() -> list[Case]:
    return [
        _ok("text/plain", SENTENCE.encode()),
        _ok("text/plain; charset=utf-8", SENTENCE.encode(), "text/plain; charset=utf-8"),
        _ok("json text field", _json({"text": SENTENCE}), JSON),
        _ok("json with charset parameter", _json({"text": SENTENCE}), "application/json; charset=utf-8"),
        _ok("json bare string", _json(SENTENCE), JSON),
        _ok("json with extra fields", _json({"text": SENTENCE, "id": 7, "meta": {"tags": ["a", "b"]}}), JSON),
        _ok("no content type", SENTENCE.encode(), None),
        _ok("octet-stream utf-8", SENTENCE.encode(), "application/octet-stream"),
        _ok("text/markdown", b"# Title\n\nSome *emphasis* here.", "text/markdown"),
        _ok("one character", b"a"),
        _ok("chinese", "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u5427\u3002".encode()),
        _ok("arabic (right to left)", "\u0627\u0644\u0642\u0637\u0629 \u0646\u0627\u0626\u0645\u0629".encode()),
        _ok("emoji and zero-width joiner", "family \U0001f468\u200d\U0001f469\u200d\U0001f467 at the \U0001f3d6".encode()),
        _ok("combining accents", "cafe\u0301 na\u0308ive".encode()),
        _ok("json unicode escapes", b'{"text": "caf\\u00e9 \\ud83d\\ude00 ok"}', JSON),
        _ok("tabs and newlines", b"first line\n\tsecond line\r\nthird line"),
        _ok("embedded bell and ANSI escapes", b"hello \x07world \x1b[31mred\x1b[0m"),
        _ok("embedded NUL", b"before\x00after"),
        _ok("json escaped control characters", b'{"text": "line\\u0000break\\u0007 and more"}', JSON),
        _ok("leading byte order mark in text/plain", "\ufeff".encode() + SENTENCE.encode()),
        _ok("900 KB of words (truncated, not refused)", ("lorem ipsum " * 76800).encode()),
        _ok("one 500 KB word", b"x" * 500_000),
        _ok("json 900 KB string", _json({"text": "dolor sit amet " * 61440}), JSON),
        _ok("html markup as text", b"<p>Hello <b>there</b></p>", "text/html"),
        _ok("json text with surrounding whitespace", b'  \n {"text": "padded"} \n', JSON),
    ]


def invalid_texts() -> list[Case]:
    nested_lists = b"[" * 100_000 + b"]" * 100_000
    nested_objects = b'{"text": ' * 50_000 + b'"x"' + b"}" * 50_000
    form, form_type = multipart({"a": b"one", "b": b"two"})
    return [
        _bad("empty body (json)", b"", words="empty"),
        _bad("empty body (text/plain)", b"", words="empty", content_type=PLAIN),
        _bad("empty body (no content type)", b"", words="empty", content_type=None),
        _bad("whitespace only", b"   \n\t  ", words="empty", content_type=PLAIN),
        _bad("unicode whitespace only", "\u3000\u00a0\u2003".encode(), words="empty", content_type=PLAIN),
        _bad("json empty text", _json({"text": ""}), words="empty"),
        _bad("json blank text", _json({"text": " \n "}), words="empty"),
        _bad("json empty object", b"{}", words='"text"'),
        _bad("json wrong key", _json({"Text": SENTENCE}), words='"text"'),
        _bad("json text is a number", _json({"text": 5}), words="must be a string"),
        _bad("json text is null", _json({"text": None}), words="must be a string"),
        _bad("json text is true", _json({"text": True}), words="must be a string"),
        _bad("json text is a list", _json({"text": [SENTENCE]}), words="must be a string"),
        _bad("json text is an object", _json({"text": {"text": SENTENCE}}), words="must be a string"),
        _bad("json text is a float", _json({"text": 1.5}), words="must be a string"),
        _bad("json list of strings", _json([SENTENCE]), words="list"),
        _bad("json number", b"42", words="int"),
        _bad("json true", b"true", words="bool"),
        _bad("json null", b"null", words="NoneType"),
        _bad("json bare NaN", b"NaN", words="float"),
        _bad("json text NaN", b'{"text": NaN}', words="must be a string"),
        _bad("json text Infinity", b'{"text": Infinity}', words="must be a string"),
        _bad("json text -Infinity", b'{"text": -Infinity}', words="must be a string"),
        _bad("json duplicate key, last one a number", b'{"text": "ok", "text": 3}', words="must be a string"),
        _bad("json nested 100000 lists deep", nested_lists, words="JSON"),
        _bad("json nested 50000 objects deep", nested_objects, words="JSON"),
        _bad("json nested 500 lists deep", b"[" * 500 + b"]" * 500, words="nested"),
        _bad("json text beside 100 levels of nesting", _json({"text": SENTENCE, "meta": nested([], 99)}), words="nested"),
        _bad("json unterminated object", b'{"text": "abc"', words="malformed JSON"),
        _bad("json single quotes", b"{'text': 'abc'}", words="malformed JSON"),
        _bad("json trailing comma", b'{"text": "abc",}', words="malformed JSON"),
        _bad("json with comments", b'{"text": "abc" /* note */}', words="malformed JSON"),
        _bad("not json at all", b"hello there", words="malformed JSON"),
        _bad("json integer with 5000 digits", b'{"text": ' + b"9" * 5000 + b"}", words="JSON"),
        _bad("json lone surrogate", b'{"text": "abc \\ud800 def"}', words="surrogate"),
        _bad("json only a lone surrogate", b'"\\udfff"', words="surrogate"),
        _bad("invalid utf-8 (ff fe)", b"\xff\xfe hello", words="UTF-8", content_type=PLAIN),
        _bad("invalid utf-8 overlong slash", b"path \xc0\xaf etc", words="UTF-8", content_type=PLAIN),
        _bad("invalid utf-8 encoded surrogate", b"abc \xed\xa0\x80 def", words="UTF-8", content_type=PLAIN),
        _bad("invalid utf-8 truncated sequence", b"caf\xc3", words="UTF-8", content_type=PLAIN),
        _bad("latin-1 bytes", "caf\u00e9 cr\u00e8me".encode("latin-1"), words="UTF-8", content_type=PLAIN),
        _bad("invalid utf-8 inside json", b'{"text": "caf\xe9"}', words="UTF-8"),
        _bad("utf-16 json", _json({"text": SENTENCE}).decode().encode("utf-16"), words="UTF-8"),
        _bad("invalid utf-8 without content type", b"\x80\x81\x82", words="UTF-8", content_type=None),
        _bad("only control characters", b"\x00\x01\x02\x03\x1b\x7f", words="no visible", content_type=PLAIN),
        _bad("json only control characters", b'{"text": "\\u0000\\u0007\\u001b"}', words="no visible"),
        _bad("image/png content type", SENTENCE.encode(), 415, "content type", "image/png"),
        _bad("application/xml content type", b"<text>hello</text>", 415, "content type", "application/xml"),
        _bad("application/pdf content type", b"%PDF-1.4", 415, "content type", "application/pdf"),
        _bad("multipart with two fields", form, 400, "single form field", form_type),
        _bad("body over the 1 MB text limit", b"a" * (1024 * 1024 + 1), 413, "limit", PLAIN),
        _bad("json over the 1 MB text limit", _json({"text": "b" * (1024 * 1024 + 1)}), 413, "limit"),
        _bad("json over the 1 MB limit beside a short text", _json({"text": SENTENCE, "pad": ["c" * 1024] * 1025}), 413,
             "limit"),
    ]


# ---- generated (seeded) ------------------------------------------------------------------------
SEED = 20261121
WORDS = ("model", "serve", "batch", "river", "quiet", "signal", "paper", "orange", "window", "seven")
CONTROL = "".join(chr(c) for c in (*range(0, 32), 127))


def random_bytes(rng: random.Random, count: int) -> list[Case]:
    cases = []
    for i in range(count):
        text = bytearray(rng.randbytes(rng.randint(1, 4096)))
        text[rng.randrange(len(text))] = 0xFF  # never valid UTF-8
        cases.append(invalid(f"random bytes as text #{i} ({len(text)} B)", bytes(text), "text/plain", 400, "UTF-8",
                             source="generated"))
    return cases


def _random_json(rng: random.Random, depth: int = 0):
    kinds: list[Callable[[], object]] = [
        lambda: rng.randint(-10**12, 10**12), lambda: rng.random() * 1e6, lambda: None, lambda: rng.random() < 0.5,
        lambda: [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))],
        lambda: {rng.choice(WORDS): _random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))},
    ]
    if depth < 2:
        return rng.choice(kinds)()
    return rng.choice(kinds[:4])()


def wrong_json(rng: random.Random, count: int) -> list[Case]:
    """Random JSON that is not {"text": "<something>"}: objects without "text", or a non-string there."""
    cases = []
    for i in range(count):
        value = _random_json(rng)
        if isinstance(value, dict):
            value.pop("text", None)
            if i % 2:
                value["text"] = _random_json(rng, depth=2)
        cases.append(invalid(f"random wrong json #{i}", json.dumps(value).encode(),
                             "application/json", 400, "", source="generated"))
    return cases


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))


def broken_utf8(rng: random.Random, count: int) -> list[Case]:
    bad = (b"\xff", b"\xc0\x80", b"\xed\xb0\x80", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"\x80")
    cases = []
    for i in range(count):
        text = sentence(rng).encode()
        at = rng.randrange(len(text))
        body = text[:at] + rng.choice(bad) + text[at:]
        cases.append(invalid(f"sentence with invalid utf-8 #{i}", body, "text/plain", 400, "UTF-8",
                             source="generated"))
    return cases


def control_characters(rng: random.Random, count: int) -> list[Case]:
    """Only control characters: refused. Words sprinkled with control characters: embedded."""
    cases = []
    for i in range(count):
        noise = "".join(rng.choice(CONTROL) for _ in range(rng.randint(1, 40)))
        cases.append(invalid(f"control characters only #{i}", json.dumps({"text": noise}).encode(),
                             "application/json", 400, "", source="generated"))
        words = [w + rng.choice(CONTROL) for w in sentence(rng).split()]
        cases.append(valid(f"words with control characters #{i}",
                           json.dumps({"text": " ".join(words)}).encode(), "application/json", source="generated"))
    return cases


def cases(seed: int = SEED) -> list[Case]:
    rng = random.Random(seed)
    return (valid_texts() + invalid_texts() + random_bytes(rng, 12) + wrong_json(rng, 16) + broken_utf8(rng, 10)
            + control_characters(rng, 8))
