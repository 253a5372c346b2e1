"""The image classifier's cases: every JPEG/PNG flavour a client may send (valid), broken ones, and
seeded generated ones (random bytes, cut and corrupted photos, random images of every mode, bombs
of random size). Same seed, same cases."""

from __future__ import annotations

import random

import numpy as np
from PIL import Image

from handlers.families.cases import Case, invalid, multipart, valid
from handlers.families.image_bytes import (
    PNG_SIGNATURE,
    chunk,
    declared_png,
    encode,
    ihdr,
    jpeg_with_size,
    last_data_offset,
    photo,
    png_from_rows,
    sixteen_bit,
)

OCTETS = "application/octet-stream"
NOT_IMAGE = "not a JPEG or PNG"


def _img(name: str, body: bytes, content_type: str | None = OCTETS) -> Case:
    return valid(name, body, content_type)


def _bad(name: str, body: bytes, status: int = 400, words: str = "", content_type: str | None = OCTETS) -> Case:
    return invalid(name, body, content_type, status, words)


def valid_images() -> list[Case]:
    rgb = photo()
    small = rgb.resize((300, 200))
    jpeg = encode(rgb, "JPEG", quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotated 90 degrees
    exif[0x010F] = "corpus camera"
    palette = small.convert("P", palette=Image.Palette.ADAPTIVE)
    wide = rgb.resize((3000, 2))
    return [
        _img("jpeg rgb", jpeg),
        _img("png rgb", encode(rgb, "PNG")),
        _img("jpeg as image/jpeg", jpeg, "image/jpeg"),
        _img("png as image/png", encode(small, "PNG"), "image/png"),
        _img("jpeg without content type", jpeg, None),
        _img("jpeg labelled image/png", jpeg, "image/png"),
        _img("png greyscale (L)", encode(rgb.convert("L"), "PNG")),
        _img("png greyscale + alpha (LA)", encode(rgb.convert("LA"), "PNG")),
        _img("png rgba", encode(rgb.convert("RGBA"), "PNG")),
        _img("png rgba fully transparent", encode(Image.new("RGBA", (64, 64), (0, 0, 0, 0)), "PNG")),
        _img("png palette (P)", encode(palette, "PNG")),
        _img("png palette with transparency", encode(palette, "PNG", transparency=0)),
        _img("png bilevel (1)", encode(small.convert("1"), "PNG")),
        _img("png 16-bit grey (I;16)", png_from_rows(160, 120, 16, 0, sixteen_bit(1))),
        _img("png 16-bit grey + alpha", png_from_rows(160, 120, 16, 4, sixteen_bit(2))),
        _img("png 16-bit rgb", png_from_rows(160, 120, 16, 2, sixteen_bit(3))),
        _img("png 16-bit rgba", png_from_rows(160, 120, 16, 6, sixteen_bit(4))),
        _img("png 2-bit grey", encode(small.convert("L").quantize(4).convert("L"), "PNG", bits=2)),
        _img("png with text chunks", png_from_rows(
            64, 48, 8, 2, np.asarray(small.resize((64, 48))),
            extra_chunks=[chunk(b"tEXt", b"Comment\x00made by the corpus"), chunk(b"gAMA", b"\x00\x00\xb1\x8f")])),
        _img("png with trailing bytes after IEND", encode(small, "PNG") + b"trailing junk"),
        _img("jpeg greyscale", encode(rgb.convert("L"), "JPEG")),
        _img("jpeg cmyk", encode(rgb.convert("CMYK"), "JPEG")),
        _img("jpeg progressive", encode(rgb, "JPEG", progressive=True, quality=85)),
        _img("jpeg 4:4:4", encode(rgb, "JPEG", subsampling=0, quality=95)),
        _img("jpeg quality 5", encode(rgb, "JPEG", quality=5)),
        _img("jpeg with exif orientation", encode(rgb, "JPEG", exif=exif.tobytes())),
        _img("jpeg with trailing bytes after EOI", jpeg + b"\x00" * 100),
        _img("jpeg optimised huffman tables", encode(rgb, "JPEG", optimize=True)),
        _img("png 1x1", encode(Image.new("RGB", (1, 1), (200, 30, 30)), "PNG")),
        _img("jpeg 1x1", encode(Image.new("RGB", (1, 1), (30, 200, 30)), "JPEG")),
        _img("png 3000x2 (extreme aspect)", encode(wide, "PNG")),
        _img("png 2x3000 (extreme aspect)", encode(wide.transpose(Image.Transpose.ROTATE_90), "PNG")),
        _img("jpeg 4000x3000 (12 MP)", encode(rgb.resize((4000, 3000)), "JPEG", quality=80)),
        _img("png all black", encode(Image.new("RGB", (224, 224)), "PNG")),
        _img("png exactly 224x224", encode(rgb.resize((224, 224)), "PNG")),
    ]


def invalid_images() -> list[Case]:
    rgb = photo()
    jpeg = encode(rgb, "JPEG", quality=90)
    png = encode(rgb.resize((300, 200)), "PNG")
    tiff = encode(rgb.resize((32, 32)), "TIFF")
    form_jpeg, form_type = multipart({"a": jpeg[:2000], "b": b"x"})
    return [
        _bad("empty body", b"", words="empty"),
        _bad("empty body without content type", b"", words="empty", content_type=None),
        _bad("plain words as octets", b"this is not an image", words=NOT_IMAGE),
        _bad("text/plain words", b"hello world", 415, "raw bytes", "text/plain"),
        _bad("json object", b'{"image": "aGVsbG8="}', 415, "raw bytes", "application/json"),
        _bad("json list", b"[1, 2, 3]", 415, "raw bytes", "application/json"),
        _bad("json number", b"42", 415, "raw bytes", "application/json"),
        _bad("json null", b"null", 415, "raw bytes", "application/json"),
        _bad("json string", b'"/9j/4AAQSkZJRg=="', 415, "raw bytes", "application/json"),
        _bad("base64 jpeg as text", __import__("base64").b64encode(jpeg[:3000]), words=NOT_IMAGE),
        _bad("gif", encode(rgb.resize((32, 32)), "GIF"), words=NOT_IMAGE),
        _bad("bmp", encode(rgb.resize((32, 32)), "BMP"), words=NOT_IMAGE),
        _bad("tiff", tiff, words=NOT_IMAGE),
        _bad("ico", encode(rgb.resize((32, 32)), "ICO"), words=NOT_IMAGE),
        _bad("svg", b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>', words=NOT_IMAGE,
             content_type="image/svg+xml"),
        _bad("pdf header", b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n", words=NOT_IMAGE),
        _bad("zip archive", b"PK\x03\x04" + b"\x00" * 60, words=NOT_IMAGE),
        _bad("png signature only", PNG_SIGNATURE, words=NOT_IMAGE),
        _bad("jpeg SOI marker only", b"\xff\xd8", words=NOT_IMAGE),
        _bad("jpeg SOI + APP0 only", jpeg[:20], words=NOT_IMAGE),
        _bad("jpeg headers without scan", jpeg[: jpeg.index(b"\xff\xda")], words="truncated"),
        _bad("jpeg cut in half", jpeg[: len(jpeg) // 2], words="truncated"),
        _bad("png cut in half", png[: len(png) // 2], words="truncated"),
        _bad("png without IDAT", PNG_SIGNATURE + ihdr(32, 32) + chunk(b"IEND", b""), words="truncated"),
        _bad("png bad IHDR checksum", PNG_SIGNATURE + ihdr(32, 32)[:-4] + b"\x00\x00\x00\x00" + png[33:],
             words=NOT_IMAGE),
        _bad("png corrupt zlib stream", PNG_SIGNATURE + ihdr(32, 32) + chunk(b"IDAT", b"\x78\x9c" + b"\xff" * 64)
             + chunk(b"IEND", b""), words="truncated"),
        _bad("png invalid bit depth", PNG_SIGNATURE + ihdr(32, 32, bit_depth=3) + png[33:], words=NOT_IMAGE),
        _bad("png invalid colour type", PNG_SIGNATURE + ihdr(32, 32, color_type=5) + png[33:], words=NOT_IMAGE),
        _bad("png zero width", declared_png(0, 32), words=""),
        _bad("png zero height", declared_png(32, 0), words=""),
        _bad("jpeg zero height", jpeg_with_size(jpeg, 600, 0), words=""),
        _bad("png declares 20000x20000", declared_png(20000, 20000), words="pixel"),
        _bad("png declares 2^31-1 square", declared_png(2**31 - 1, 2**31 - 1), words=""),
        _bad("png declares 7000x6000 (just over 40 MP)", declared_png(7000, 6000), words="pixel"),
        _bad("jpeg declares 65500x65500", jpeg_with_size(jpeg, 65500, 65500), words="pixel"),
        _bad("png declares 100000x1 with no data", declared_png(100000, 1, data=b""), words="truncated"),
        _bad("multipart with two fields", form_jpeg, 400, "single form field", form_type),
        _bad("image/png label on words", b"definitely not a png", words=NOT_IMAGE, content_type="image/png"),
        *costly_containers(),
    ]


def costly_containers() -> list[Case]:
    """Small files whose structure would cost PIL or libjpeg seconds: repeated progressive scans,
    thousands of empty PNG chunks, JPEG markers or junk before the first scan."""
    progressive = encode(Image.new("RGB", (2000, 2000)), "JPEG", progressive=True)  # its last scan: 14 bytes
    end = progressive.rindex(b"\xff\xd9")
    last_scan = progressive[progressive.rindex(b"\xff\xda"):end]
    small = encode(photo().resize((64, 48)), "PNG")
    idat = small.index(b"IDAT") - 4
    jpeg = encode(photo().resize((64, 48)), "JPEG")
    return [
        _bad("progressive 4 MP jpeg repeating a scan 1000 times", progressive[:end] + last_scan * 1000 + progressive[end:],
             words="scans"),
        _bad("png with 100000 empty chunks before its pixels", small[:idat] + chunk(b"abCd", b"") * 100_000
             + small[idat:], words="chunks"),
        _bad("png with 100000 empty pixel chunks", small[:-12] + chunk(b"IDAT", b"") * 100_000 + small[-12:],
             words="chunks"),
        _bad("jpeg with 100000 comment markers", jpeg[:2] + b"\xff\xfe\x00\x02" * 100_000 + jpeg[2:], words="markers"),
        _bad("jpeg with 1 MB of junk between its markers", jpeg[:2] + b"\xff\xfe\x00\x02" + b"\x00" * 1_000_000 + jpeg[2:],
             words="junk"),
    ]


def multipart_image() -> Case:
    """curl -F data=@photo.jpg: TorchServe passes the form field named 'data' to the handler."""
    body, content_type = multipart({"data": encode(photo().resize((300, 200)), "JPEG")})
    return _img("multipart form field 'data'", body, content_type)


# ---- generated (seeded) ------------------------------------------------------------------------
SEED = 20261121
PHOTOS = ("coffee.png", "chelsea.png", "astronaut.png", "rocket.jpg")
IMAGE_MODES = ("RGB", "L", "LA", "RGBA", "P", "1", "I;16", "CMYK")


def random_bytes(rng: random.Random, count: int) -> list[Case]:
    cases = []
    for i in range(count):
        body = bytearray(rng.randbytes(rng.randint(1, 4096)))
        if body[:2] == b"\xff\xd8" or body[:4] == PNG_SIGNATURE[:4]:
            body[0] = 0
        cases.append(invalid(f"random bytes #{i} ({len(body)} B)", bytes(body), "application/octet-stream", 400,
                             "not a JPEG or PNG", source="generated"))
    return cases


def cut_photos(rng: random.Random) -> list[Case]:
    """Each photo as JPEG and PNG, cut at random points inside its pixel data."""
    cases = []
    for name in PHOTOS:
        for fmt in ("JPEG", "PNG"):
            data = encode(photo(name).resize((320, 240)), fmt)
            start = data.index(b"\xff\xda") + 2 if fmt == "JPEG" else data.index(b"IDAT") + 4
            for _ in range(2):
                cut = rng.randrange(start, last_data_offset(data) - 64)
                cases.append(invalid(f"{name} as {fmt} cut at {cut}/{len(data)}", data[:cut],
                                     "application/octet-stream", 400, "truncated", source="generated"))
            cut = rng.randrange(2, start - 2)
            cases.append(invalid(f"{name} as {fmt} header cut at {cut}", data[:cut],
                                 "application/octet-stream", 400, "", source="generated"))
    return cases


def broken_signatures(rng: random.Random, count: int) -> list[Case]:
    """A real photo whose magic bytes are overwritten: nothing identifies it as an image."""
    cases = []
    for i in range(count):
        data = bytearray(encode(photo(PHOTOS[i % len(PHOTOS)]).resize((160, 120)), ("JPEG", "PNG")[i % 2]))
        for at in rng.sample(range(4), 2):
            data[at] = (data[at] + rng.randint(1, 255)) % 256
        cases.append(invalid(f"photo with a corrupt signature #{i}", bytes(data),
                             "application/octet-stream", 400, "not a JPEG or PNG", source="generated"))
    return cases


def random_images(rng: random.Random, count: int) -> list[Case]:
    """Valid images of random size, mode and content: all must be classified."""
    cases = []
    for i in range(count):
        mode = IMAGE_MODES[i % len(IMAGE_MODES)]
        width, height = rng.randint(1, 640), rng.randint(1, 640)
        noise = np.random.default_rng(rng.getrandbits(32)).integers(0, 256, (height, width, 3), dtype=np.uint8)
        image = Image.fromarray(noise).convert(mode) if mode != "I;16" else Image.fromarray(
            noise[..., 0].astype(np.uint16) * 257)
        fmt = "JPEG" if mode in ("CMYK",) or (mode in ("RGB", "L") and rng.random() < 0.5) else "PNG"
        cases.append(valid(f"random {mode} {width}x{height} {fmt}", encode(image, fmt),
                           rng.choice(("image/jpeg", "image/png", "application/octet-stream", None)),
                           source="generated"))
    return cases


def random_bombs(rng: random.Random, count: int) -> list[Case]:
    """Headers declaring more pixels than the 40 MP limit, with almost no data behind them."""
    jpeg = encode(photo().resize((64, 48)), "JPEG")
    cases = []
    for i in range(count):
        width = rng.randint(6400, 65500)
        height = rng.randint(40_000_001 // width + 1, 65500)
        body = declared_png(width, height) if i % 2 else jpeg_with_size(jpeg, width, height)
        cases.append(invalid(f"{'png' if i % 2 else 'jpeg'} declaring {width}x{height}", body,
                             "application/octet-stream", 400, "pixel", source="generated"))
    return cases


def cases(seed: int = SEED) -> list[Case]:
    rng = random.Random(seed)
    return (valid_images() + [multipart_image()] + invalid_images() + random_bytes(rng, 12) + cut_photos(rng)
            + broken_signatures(rng, 8) + random_images(rng, 16) + random_bombs(rng, 8))
