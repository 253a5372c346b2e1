"""Property-based fuzzing (hypothesis) of the handlers' input parsing, no model needed.

Properties: for any body and content type, parsing either returns a well-formed item or raises a
HandlerError carrying a 4xx and a message; never another exception (which would fail a request
with a vague message, or, past decode, its whole batch). Valid images of any mode and size are
always decoded; texts with something visible in them are always accepted, as given.
"""

import json
import string

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from build.examples import worker_input
from handlers.engines.torchserve import request_body, status_phrase
from handlers.errors import HandlerError
from handlers.families.image_bytes import encode, photo
from handlers.families.image_classifier import ImageSettings
from handlers.families.image_decode import decode_image
from handlers.families.text_embedder import _VISIBLE, TextSettings, text_from_body
from tests.unit.conftest import fuzz_examples

pytestmark = pytest.mark.unit

# Deterministic (a failure reproduces on every run), no example database written into the repo.
FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=fuzz_examples(300),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
IMAGES = ImageSettings(max_body_bytes=256 * 1024, max_image_pixels=4_000_000)
TEXTS = TextSettings()
CONTENT_TYPES = st.sampled_from(["", "application/json", "text/plain", "text/csv", "application/octet-stream",
                                 "image/png", "multipart/form-data", "application/x-www-form-urlencoded"])


def assert_refusal(err: HandlerError) -> None:
    assert 400 <= err.status < 500 and err.message.strip()
    assert status_phrase(err.message)  # the reason phrase TorchServe sends is never empty


def parse_text(body, content_type):
    try:
        text = text_from_body(body, content_type, TEXTS)
    except HandlerError as err:
        assert_refusal(err)
        return None
    assert isinstance(text, str) and _VISIBLE.search(text)
    assert len(text) <= TEXTS.max_length * 100
    text.encode("utf-8")  # what the tokenizer needs: no unpaired surrogates
    return text


@FUZZ
@given(body=st.binary(max_size=2048), content_type=CONTENT_TYPES)
def test_text_any_bytes(body, content_type):
    parse_text(worker_input(body, content_type), content_type)


# Every code point, unpaired surrogates included (JSON can carry them as \\udXXX escapes).
ANY_CHAR = st.characters(exclude_categories=()) | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(ANY_CHAR),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["text", "Text", "x"]), inner,
                                                                max_size=3),
    max_leaves=12,
)


@FUZZ
@given(value=JSON_VALUES | st.fixed_dictionaries({"text": st.text(ANY_CHAR, max_size=40)}))
def test_text_any_json(value):
    """As TorchServe passes JSON: parsed already (its decoded value), or as bytes for the handler."""
    raw = json.dumps(value).encode()  # ASCII: surrogates escaped as \\udXXX
    for body, ctype in ((value, "application/json"), (raw, "application/json; charset=utf-8")):
        text = parse_text(body, ctype)
        inner = value.get("text") if isinstance(value, dict) else value
        if text is not None:
            assert isinstance(inner, str) and inner.startswith(text)


@FUZZ
@given(text=st.text(ANY_CHAR, min_size=1, max_size=300))
def test_text_with_something_visible_is_accepted_as_given(text):
    if not (_VISIBLE.search(text) and text.strip()):
        return
    for body, ctype in (({"text": text}, "application/json"), (text, "text/plain")):
        try:
            got = text_from_body(body, ctype, TEXTS)
        except HandlerError as err:
            assert "surrogate" in err.message and any(0xD800 <= ord(c) <= 0xDFFF for c in text)
        else:
            assert got == text


@FUZZ
@given(request=st.one_of(st.binary(max_size=16), st.dictionaries(st.text(max_size=8), st.binary(max_size=8),
                                                                   max_size=4)))
def test_request_body_picks_one_field_or_refuses(request):
    try:
        body = request_body(request)
    except HandlerError as err:
        assert_refusal(err)
        assert isinstance(request, dict) and len(request) != 1 and not {"data", "body"} & set(request)
    else:
        assert body is request or body in request.values()


def check_image(body, limits: ImageSettings = IMAGES):
    try:
        array = decode_image(body, limits)
    except HandlerError as err:
        assert_refusal(err)
        return None
    assert array.shape == (224, 224, 3) and array.dtype == np.uint8
    return array


@FUZZ
@given(body=st.binary(max_size=4096))
def test_image_any_bytes(body):
    check_image(body)


@FUZZ
@given(start=st.sampled_from([b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff"]), body=st.binary(max_size=2048),
       markers=st.lists(st.sampled_from([b"\xff\xda", b"\xff\xfe\x00\x02", b"\x00\x00\x00\x00IEND", b"\xff"]),
                        max_size=8))
def test_image_any_structure_after_a_signature(start, body, markers):
    """The container walks (PNG chunks, JPEG markers) on anything that starts like an image."""
    check_image(start + b"".join(markers) + body)


SEEDS = {fmt: encode(photo().resize((96, 64)), fmt) for fmt in ("JPEG", "PNG")}


@FUZZ
@given(fmt=st.sampled_from(sorted(SEEDS)), data=st.data())
def test_image_mutated_photo(fmt, data):
    """A real image cut, overwritten or spliced anywhere: a decoded image or a 4xx."""
    body = bytearray(SEEDS[fmt])
    for _ in range(data.draw(st.integers(1, 4))):
        if not body:
            break
        at = data.draw(st.integers(0, len(body) - 1))
        action = data.draw(st.sampled_from(["cut", "overwrite", "insert", "delete"]))
        chunk = data.draw(st.binary(min_size=1, max_size=8))
        if action == "cut":
            body = body[: max(at, 1)]
        elif action == "overwrite":
            body[at: at + len(chunk)] = chunk
        elif action == "insert":
            body[at:at] = chunk
        else:
            del body[at: at + len(chunk)]
    check_image(bytes(body))


MODES = ["1", "L", "LA", "P", "RGB", "RGBA", "I;16", "CMYK"]


@FUZZ
@given(mode=st.sampled_from(MODES), width=st.integers(1, 400), height=st.integers(1, 400),
       seed=st.integers(0, 2**16), jpeg=st.booleans())
def test_valid_images_of_any_mode_and_size_are_decoded(mode, width, height, seed, jpeg):
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    image = Image.fromarray(pixels[..., 0].astype(np.uint16) * 257) if mode == "I;16" else image.convert(mode)
    fmt = "JPEG" if mode == "CMYK" or (jpeg and mode in ("L", "RGB")) else "PNG"
    assert check_image(encode(image, fmt), ImageSettings()) is not None, (mode, width, height, fmt)


@FUZZ
@given(message=st.text(alphabet=string.printable + "\u00e9\u4e2d\x00\x1b\u2028", max_size=400))
def test_status_phrase_is_one_printable_line(message):
    phrase = status_phrase(message)
    assert len(phrase) <= 200 and "\n" not in phrase and "\r" not in phrase
    assert all(32 <= ord(c) < 127 for c in phrase)


def test_png_header_declaring_a_bomb_is_refused_before_decoding():
    big = Image.new("L", (2100, 2000))  # 4.2 MP > the 4 MP limit used here, tiny when compressed
    with pytest.raises(HandlerError, match="over the limit of 4000000"):
        decode_image(encode(big, "PNG"), IMAGES)
    assert len(encode(big, "PNG")) < IMAGES.max_body_bytes  # refused for its pixels, not its bytes
