"""Decode and validate one image request into a model-sized RGB or greyscale array.

Cheap on purpose: JPEGs are decoded in draft mode (DCT scaling straight to about the target size)
and the crop + resize is a single resample of the crop box, with PIL's integer pre-reduction.
"""

from __future__ import annotations

import io
import math
import struct
import zlib

import numpy as np
from PIL import Image

from handlers.errors import BadInput, PayloadTooLarge, UnsupportedMediaType
from handlers.families.image_settings import ImageSettings
from handlers.families.image_structure import check_structure

FORMATS = ("JPEG", "PNG")
# Everything PIL raises for a corrupt or truncated file, found by fuzzing its JPEG/PNG readers.
_CORRUPT = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error, IndexError, TypeError)


def image_bytes(body, settings: ImageSettings) -> bytes:
    if isinstance(body, (dict, list, str, int, float)) or body is None:
        raise UnsupportedMediaType("expected the raw bytes of a JPEG or PNG image as the request body")
    if len(body) == 0:
        raise BadInput("empty request body: send the bytes of a JPEG or PNG image")
    if len(body) > settings.max_body_bytes:
        raise PayloadTooLarge(f"image body is {len(body)} bytes, over the limit of {settings.max_body_bytes}")
    return bytes(body)


def open_checked(data: bytes, settings: ImageSettings) -> Image.Image:
    """Open (header only) and check dimensions before any pixel is decoded."""
    check_structure(data, settings)  # before PIL walks the file's structure
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError:
        raise BadInput(f"image is over the pixel limit of {settings.max_image_pixels}") from None
    except _CORRUPT:
        raise BadInput("cannot read the image: not a JPEG or PNG, or its header is truncated or corrupt") from None
    width, height = image.size
    if width <= 0 or height <= 0:
        raise BadInput(f"image has zero size ({width}x{height})")
    if width * height > settings.max_image_pixels:
        raise BadInput(
            f"image is {width}x{height} = {width * height} pixels, over the limit of {settings.max_image_pixels}"
        )
    return image


def crop_box(width: int, height: int, settings: ImageSettings):
    """Centre crop of the classic 'resize shorter side to resize_size, crop image_size', in source pixels."""
    side = settings.image_size * min(width, height) / settings.resize_size
    left, top = (width - side) / 2, (height - side) / 2
    return (left, top, left + side, top + side)


def to_mode(image: Image.Image, mode: str) -> Image.Image:
    """Any JPEG/PNG mode to 8-bit RGB or L (greyscale, palette, alpha, CMYK and 16-bit are all valid)."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        # PIL clips 16-bit to 255 when converting; scale to 8 bits instead.
        wide = np.asarray(image).astype(np.uint32)
        peak = 65535 if image.mode.startswith("I;16") else max(int(wide.max()), 1)
        image = Image.fromarray((wide * 255 // peak).astype(np.uint8), "L")
    return image if image.mode == mode else image.convert(mode)


def decode_image(body, settings: ImageSettings) -> np.ndarray:
    """Request body -> (image_size, image_size, channels) uint8 array, or BadInput saying what is wrong."""
    image = open_checked(image_bytes(body, settings), settings)
    width, height = image.size
    mode = "RGB" if settings.channels == 3 else "L"
    try:
        if settings.draft_decode and image.format == "JPEG":
            scale = settings.resize_size / min(width, height)
            image.draft(mode, (math.ceil(width * scale), math.ceil(height * scale)))
        image.load()
        rgb = to_mode(image, mode)
    except Image.DecompressionBombError:
        raise BadInput(f"image is over the pixel limit of {settings.max_image_pixels}") from None
    except _CORRUPT as err:
        raise BadInput(f"truncated or corrupt image ({type(err).__name__})") from None
    # Draft decoding may have shrunk the image: express the crop box in the decoded pixels.
    box = crop_box(rgb.width, rgb.height, settings)
    size = (settings.image_size, settings.image_size)
    resized = rgb.resize(size, Image.Resampling.BILINEAR, box=box, reducing_gap=3.0)
    pixels = np.asarray(resized)
    return pixels if pixels.ndim == 3 else pixels[:, :, None]
