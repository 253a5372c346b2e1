"""Seeded generated cases: random bytes, cut and corrupted photos, random images of every mode,
bombs of random size, random wrong JSON, random invalid UTF-8. Same seed, same corpus."""

from __future__ import annotations

import json
import random
from typing import Callable, List

import numpy as np
from PIL import Image

from benchmarks.reliability.corpus.case import IMAGE, TEXT, Case, invalid, valid
from benchmarks.reliability.corpus.imagebytes import (
    PNG_SIGNATURE,
    declared_png,
    encode,
    jpeg_with_size,
    last_data_offset,
    photo,
)

SEED = 20261121
PHOTOS = ("coffee.png", "chelsea.png", "astronaut.png", "rocket.jpg")
IMAGE_MODES = ("RGB", "L", "LA", "RGBA", "P", "1", "I;16", "CMYK")
WORDS = ("model", "serve", "batch", "river", "quiet", "signal", "paper", "orange", "window", "seven")
CONTROL = "".join(chr(c) for c in (*range(0, 32), 127))


def random_bytes(rng: random.Random, count: int) -> List[Case]:
    cases = []
    for i in range(count):
        body = bytearray(rng.randbytes(rng.randint(1, 4096)))
        if body[:2] == b"\xff\xd8" or body[:4] == PNG_SIGNATURE[:4]:
            body[0] = 0
        cases.append(invalid(f"random bytes #{i} ({len(body)} B)", IMAGE, bytes(body),
                             "application/octet-stream", 400, "not a JPEG or PNG", source="generated"))
        text = bytearray(rng.randbytes(rng.randint(1, 4096)))
        text[rng.randrange(len(text))] = 0xFF  # never valid UTF-8
        cases.append(invalid(f"random bytes as text #{i} ({len(text)} B)", TEXT, bytes(text),
                             "text/plain", 400, "UTF-8", source="generated"))
    return cases


def cut_photos(rng: random.Random) -> List[Case]:
    """Each photo as JPEG and PNG, cut at random points inside its pixel data."""
    cases = []
    for name in PHOTOS:
        for fmt in ("JPEG", "PNG"):
            data = encode(photo(name).resize((320, 240)), fmt)
            start = data.index(b"\xff\xda") + 2 if fmt == "JPEG" else data.index(b"IDAT") + 4
            for _ in range(2):
                cut = rng.randrange(start, last_data_offset(data) - 64)
                cases.append(invalid(f"{name} as {fmt} cut at {cut}/{len(data)}", IMAGE, data[:cut],
                                     "application/octet-stream", 400, "truncated", source="generated"))
            cut = rng.randrange(2, start - 2)
            cases.append(invalid(f"{name} as {fmt} header cut at {cut}", IMAGE, data[:cut],
                                 "application/octet-stream", 400, "", source="generated"))
    return cases


def broken_signatures(rng: random.Random, count: int) -> List[Case]:
    """A real photo whose magic bytes are overwritten: nothing identifies it as an image."""
    cases = []
    for i in range(count):
        data = bytearray(encode(photo(PHOTOS[i % len(PHOTOS)]).resize((160, 120)), ("JPEG", "PNG")[i % 2]))
        for at in rng.sample(range(4), 2):
            data[at] = (data[at] + rng.randint(1, 255)) % 256
        cases.append(invalid(f"photo with a corrupt signature #{i}", IMAGE, bytes(data),
                             "application/octet-stream", 400, "not a JPEG or PNG", source="generated"))
    return cases


def random_images(rng: random.Random, count: int) -> List[Case]:
    """Valid images of random size, mode and content: all must be classified."""
    cases = []
    for i in range(count):
        mode = IMAGE_MODES[i % len(IMAGE_MODES)]
        width, height = rng.randint(1, 640), rng.randint(1, 640)
        noise = np.random.default_rng(rng.getrandbits(32)).integers(0, 256, (height, width, 3), dtype=np.uint8)
        image = Image.fromarray(noise).convert(mode) if mode != "I;16" else Image.fromarray(
            noise[..., 0].astype(np.uint16) * 257)
        fmt = "JPEG" if mode in ("CMYK",) or (mode in ("RGB", "L") and rng.random() < 0.5) else "PNG"
        cases.append(valid(f"random {mode} {width}x{height} {fmt}", IMAGE, encode(image, fmt),
                           rng.choice(("image/jpeg", "image/png", "application/octet-stream", None)),
                           source="generated"))
    return cases


def random_bombs(rng: random.Random, count: int) -> List[Case]:
    """Headers declaring more pixels than the 40 MP limit, with almost no data behind them."""
    jpeg = encode(photo().resize((64, 48)), "JPEG")
    cases = []
    for i in range(count):
        width = rng.randint(6400, 65500)
        height = rng.randint(40_000_001 // width + 1, 65500)
        body = declared_png(width, height) if i % 2 else jpeg_with_size(jpeg, width, height)
        cases.append(invalid(f"{'png' if i % 2 else 'jpeg'} declaring {width}x{height}", IMAGE, body,
                             "application/octet-stream", 400, "pixel", source="generated"))
    return cases


def _random_json(rng: random.Random, depth: int = 0):
    kinds: List[Callable[[], object]] = [
        lambda: rng.randint(-10**12, 10**12), lambda: rng.random() * 1e6, lambda: None, lambda: rng.random() < 0.5,
        lambda: [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))],
        lambda: {rng.choice(WORDS): _random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))},
    ]
    if depth < 2:
        return rng.choice(kinds)()
    return rng.choice(kinds[:4])()


def wrong_json(rng: random.Random, count: int) -> List[Case]:
    """Random JSON that is not {"text": "<something>"}: objects without "text", or a non-string there."""
    cases = []
    for i in range(count):
        value = _random_json(rng)
        if isinstance(value, dict):
            value.pop("text", None)
            if i % 2:
                value["text"] = _random_json(rng, depth=2)
        cases.append(invalid(f"random wrong json #{i}", TEXT, json.dumps(value).encode(),
                             "application/json", 400, "", source="generated"))
    return cases


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))


def broken_utf8(rng: random.Random, count: int) -> List[Case]:
    bad = (b"\xff", b"\xc0\x80", b"\xed\xb0\x80", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"\x80")
    cases = []
    for i in range(count):
        text = sentence(rng).encode()
        at = rng.randrange(len(text))
        body = text[:at] + rng.choice(bad) + text[at:]
        cases.append(invalid(f"sentence with invalid utf-8 #{i}", TEXT, body, "text/plain", 400, "UTF-8",
                             source="generated"))
    return cases


def control_characters(rng: random.Random, count: int) -> List[Case]:
    """Only control characters: refused. Words sprinkled with control characters: embedded."""
    cases = []
    for i in range(count):
        noise = "".join(rng.choice(CONTROL) for _ in range(rng.randint(1, 40)))
        cases.append(invalid(f"control characters only #{i}", TEXT, json.dumps({"text": noise}).encode(),
                             "application/json", 400, "", source="generated"))
        words = [w + rng.choice(CONTROL) for w in sentence(rng).split()]
        cases.append(valid(f"words with control characters #{i}", TEXT,
                           json.dumps({"text": " ".join(words)}).encode(), "application/json", source="generated"))
    return cases


def cases(seed: int = SEED) -> List[Case]:
    rng = random.Random(seed)
    return (random_bytes(rng, 12) + cut_photos(rng) + broken_signatures(rng, 8) + random_images(rng, 16)
            + random_bombs(rng, 8) + wrong_json(rng, 16) + broken_utf8(rng, 10) + control_characters(rng, 8))
