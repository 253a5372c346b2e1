"""Byte-level image builders for the image cases: photo-like pictures made here, hand-made PNG
chunks, patched JPEG headers."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterable
from functools import cache

import numpy as np
from PIL import Image

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@cache
def photo(name: str = "coffee.png") -> Image.Image:
    """A photo-like RGB picture, 640x480, seeded by `name`: smooth light, a few hard-edged shapes and
    sensor noise, so JPEG and PNG compress it as they do photographs. What the cases take apart (its
    bytes) does not depend on what it shows, and the handler package carries no photographs."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    y, x = np.mgrid[0:480, 0:640].astype(np.float32)
    light = [128 + 100 * np.sin(x / rng.uniform(60, 200) + rng.uniform(0, 6)) * np.cos(y / rng.uniform(60, 200))
             for _ in range(3)]
    picture = np.stack(light, axis=-1)
    for _ in range(6):
        cx, cy, r = rng.uniform(0, 640), rng.uniform(0, 480), rng.uniform(20, 120)
        picture[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
    picture += rng.normal(0, 6, picture.shape)
    return Image.fromarray(np.clip(picture, 0, 255).astype(np.uint8), "RGB")


def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def chunk(kind: bytes, data: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(kind + data) if crc is None else crc
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc & 0xFFFFFFFF)


def ihdr(width: int, height: int, bit_depth: int = 8, color_type: int = 2, interlace: int = 0) -> bytes:
    return chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, interlace))


def png_from_rows(width: int, height: int, bit_depth: int, color_type: int, pixels: np.ndarray,
                  extra_chunks: Iterable[bytes] = ()) -> bytes:
    """A PNG written by hand (PIL cannot write 16-bit RGB/RGBA): filter type 0 on every row."""
    dtype = ">u2" if bit_depth == 16 else "u1"
    rows = np.ascontiguousarray(pixels.astype(dtype)).reshape(height, -1).view(np.uint8)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)
    return (PNG_SIGNATURE + ihdr(width, height, bit_depth, color_type) + b"".join(extra_chunks)
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def declared_png(width: int, height: int, bit_depth: int = 8, color_type: int = 2, data: bytes = b"\0" * 64) -> bytes:
    """A PNG whose header declares width x height over almost no pixel data (a decompression bomb)."""
    return PNG_SIGNATURE + ihdr(width, height, bit_depth, color_type) + chunk(b"IDAT", zlib.compress(data)) + chunk(b"IEND", b"")


def sixteen_bit(channels: int, size: tuple[int, int] = (160, 120)) -> np.ndarray:
    """The photo at 16 bits per sample, `channels` 1 (grey), 2 (grey+alpha), 3 (RGB) or 4 (RGBA)."""
    rgb = np.asarray(photo().resize(size), dtype=np.uint16) * 257
    grey = np.asarray(photo().resize(size).convert("L"), dtype=np.uint16) * 257
    alpha = np.full(grey.shape, 65535, np.uint16)
    return {1: grey, 2: np.dstack([grey, alpha]), 3: rgb, 4: np.dstack([rgb, alpha])}[channels]


def jpeg_with_size(jpeg: bytes, width: int, height: int) -> bytes:
    """A baseline JPEG whose SOF0 header is patched to declare width x height."""
    at = jpeg.index(b"\xff\xc0")
    # FFC0, length (2), precision (1), height (2), width (2)
    return jpeg[: at + 5] + struct.pack(">HH", height, width) + jpeg[at + 9:]


def last_data_offset(image: bytes) -> int:
    """Where the pixel data ends: cutting before this is a truncated image, after it maybe not."""
    if image.startswith(PNG_SIGNATURE):
        return image.rindex(b"IDAT") + 4
    return image.rindex(b"\xff\xd9")
