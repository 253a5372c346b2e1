"""Bounds on an image's container, read from its bytes before PIL parses it.

PIL walks a file's structure in Python: a PNG chunk by chunk (before and after the pixel data), a
JPEG's header marker by marker and any junk between markers byte by byte; libjpeg then makes one
pass over every pixel's coefficients per scan. None of that is bounded by the pixel limit: a few
megabytes of empty PNG chunks, of JPEG markers or junk, or of repeated progressive scans cost
seconds of worker time per request. These walks count what PIL would meet and stop at the limit, so
checking costs at most `max_image_segments` steps.
"""

from __future__ import annotations

from handlers.errors import BadInput
from handlers.families.image_bytes import PNG_SIGNATURE
from handlers.families.image_settings import ImageSettings

_JPEG_START = b"\xff\xd8\xff"  # what PIL's JPEG reader accepts
_SOS = 0xDA
_STANDALONE = frozenset({0x01, *range(0xD0, 0xDA)})  # markers without a length: TEM, RSTn, SOI, EOI


def check_structure(data: bytes, settings: ImageSettings) -> None:
    """Refuse a PNG or JPEG whose container holds more than the settings allow (400 naming the
    limit); other bytes are left for PIL to refuse."""
    limit = settings.max_image_segments
    if data.startswith(PNG_SIGNATURE) and _png_chunks(data, limit) > limit:
        raise BadInput(f"PNG holds more than {limit} chunks, over the limit (an image needs a few dozen)")
    if data.startswith(_JPEG_START):
        if _jpeg_header_steps(data, limit) > limit:
            raise BadInput(f"JPEG header holds more than {limit} markers or junk bytes before its first scan, over "
                           "the limit (an image needs a few dozen)")
        # Entropy-coded data escapes every 0xFF byte, so each 0xFF 0xDA is a start-of-scan marker (an
        # embedded thumbnail's count too: the bound is loose by those).
        scans = data.count(b"\xff\xda")
        if scans > settings.max_jpeg_scans:
            raise BadInput(f"JPEG holds {scans} scans, over the limit of {settings.max_jpeg_scans} (a progressive "
                           "JPEG has about 10)")


def _png_chunks(data: bytes, limit: int) -> int:
    """PNG chunks up to IEND, counted up to one past `limit`."""
    at, count = len(PNG_SIGNATURE), 0
    while at + 8 <= len(data) and count <= limit:
        count += 1
        if data[at + 4:at + 8] == b"IEND":
            break
        at += 12 + int.from_bytes(data[at:at + 4], "big")
    return count


def _jpeg_header_steps(data: bytes, limit: int) -> int:
    """The steps PIL's JPEG header parser takes before the first scan (one per marker, one per junk
    byte), counted up to one past `limit`."""
    at, steps = 2, 0  # after the start-of-image marker
    while at + 1 < len(data) and steps <= limit:
        steps += 1
        if data[at] != 0xFF:  # junk: skipped a byte at a time
            at += 1
            continue
        marker = data[at + 1]
        if marker == _SOS:
            break
        if marker in (0x00, 0xFF):  # an escaped 0xFF or fill bytes
            at += 1 if marker == 0xFF else 2
        elif marker in _STANDALONE:
            at += 2
        else:
            at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return steps
