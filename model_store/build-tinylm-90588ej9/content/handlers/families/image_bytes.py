"""Byte-level image builders for the image cases: encoded real photos (scikit-image's wheel ships
them; imported only when a case is built), hand-made PNG chunks, patched JPEG headers."""

from __future__ import annotations

import io
import struct
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import numpy as np
from PIL import Image

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@lru_cache(maxsize=None)
def photo(name: str = "coffee.png") -> Image.Image:
    """A real colour photograph (RGB) from scikit-image's data."""
    import skimage

    data = Path(skimage.__file__).parent / "data" / name
    return Image.open(io.BytesIO(data.read_bytes())).convert("RGB")


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
