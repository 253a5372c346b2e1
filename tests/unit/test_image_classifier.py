"""Image handler on a tiny random-weight CNN (tests/tiny.py): every input mode decoded, bad inputs in
a batch answered alone, stage metrics. What ImageNet weights make of real photos: tests/archives."""

import io
import time

import numpy as np
import pytest
from PIL import Image

from handlers.errors import BadInput
from handlers.families import FAMILIES, image_bytes, image_cases
from handlers.families.image_decode import decode_image
from handlers.families.image_settings import ImageSettings
from tests.references import decoded
from tests.tiny import LABELS

from .conftest import encode, make_handler, png_of

pytestmark = pytest.mark.unit

FAMILY = FAMILIES["image_classifier"]


@pytest.fixture(scope="module")
def served(tiny_dirs):
    return make_handler(tiny_dirs["tiny_image"], "tiny_image")


def well_formed(handler, answer: dict) -> None:
    settings = handler.settings.family_settings
    assert FAMILY.answer_problem(settings, answer) is None, answer
    assert len(answer) == settings.top_k and set(answer) <= set(LABELS)
    assert list(answer.values()) == sorted(answer.values(), reverse=True) and sum(answer.values()) <= 1.0 + 1e-6


def alone(handler, context, body: bytes) -> dict:
    context.statuses.clear()
    (answer,) = decoded(handler.handle([{"body": body}], context))
    assert context.statuses == {}, context.statuses
    return answer


def test_every_valid_mode_is_classified(served, photos):
    """The photo in every mode a JPEG or PNG may carry gets a well-formed answer, and the modes that
    carry the same pixels get the same one; a 1x1 image too."""
    rgb = Image.open(io.BytesIO(photos["coffee"])).convert("RGB")
    grey = rgb.convert("L")
    grey16 = (np.asarray(grey, dtype=np.uint16) * 257)
    modes = {
        "L": encode(grey, "PNG"),
        "RGBA": encode(rgb.convert("RGBA"), "PNG"),
        "P": encode(rgb.convert("P"), "PNG"),
        "I;16": png_of(grey16),  # PIL alone clips 16-bit to white: the handler scales it
        "CMYK jpeg": encode(rgb.convert("CMYK"), "JPEG"),
        "grey jpeg": encode(grey, "JPEG"),
    }
    handler, context = served
    context.statuses.clear()
    answers = decoded(handler.handle([{"body": b} for b in modes.values()] + [{"body": png_of(np.zeros((1, 1, 3), np.uint8))}],
                                     context))
    assert context.statuses == {}
    for answer in answers:
        well_formed(handler, answer)
    by_mode = dict(zip(modes, answers))
    same_pixels = {"RGBA": encode(rgb, "PNG"), "L": encode(grey.convert("RGB"), "PNG"), "I;16": modes["L"]}
    for mode, twin in same_pixels.items():
        assert FAMILY.disagreement(None, by_mode[mode], alone(handler, context, twin)) is None, mode


def huge_declared_png(width: int, height: int) -> bytes:
    """A valid PNG header declaring width x height, with almost no data (a decompression bomb)."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 10)) + chunk(b"IEND", b"")


BAD = {
    "empty": (b"", 400, "empty"),
    "text": (b"not an image", 400, "not a JPEG or PNG"),
    "truncated png": (None, 400, "truncated or corrupt"),
    "bomb": (huge_declared_png(20000, 20000), 400, "pixel"),
    "json": ({"text": "hi"}, 415, "raw bytes"),
    "gif": (encode(Image.new("RGB", (8, 8)), "GIF"), 400, "not a JPEG or PNG"),
}


def test_bad_inputs_fail_alone(served, photos):
    handler, context = served
    context.statuses.clear()
    bodies = {**{k: v[0] for k, v in BAD.items()}, "truncated png": photos["cat"][: len(photos["cat"]) // 2]}
    batch = [{"body": photos["coffee"]}] + [{"body": b} for b in bodies.values()] + [{"body": photos["cat"]}]
    answers = decoded(handler.handle(batch, context))
    for i, (name, (_, status, words)) in enumerate(BAD.items(), start=1):
        assert context.statuses[i][0] == status, name
        assert answers[i]["code"] == status and words in answers[i]["message"], (name, answers[i])
    assert 0 not in context.statuses and len(batch) - 1 not in context.statuses
    # The good ones are answered as they are alone: their bad batch-mates changed nothing.
    assert FAMILY.disagreement(None, answers[0], alone(handler, context, photos["coffee"])) is None
    assert FAMILY.disagreement(None, answers[-1], alone(handler, context, photos["cat"])) is None
    context.statuses.clear()


def test_all_bad_batch_skips_inference(served):
    handler, context = served
    context.metrics.calls.clear()
    answers = decoded(handler.handle([{"body": b""}, {"body": b"x"}], context))
    assert [a["code"] for a in answers] == [400, 400]
    assert not any(name == "HandlerInferenceMs" for _, name, _, _ in context.metrics.calls)
    context.statuses.clear()


def test_stage_metrics_emitted(served, photos):
    handler, context = served
    context.metrics.calls.clear()
    decoded(handler.handle([{"body": photos["cat"]}] * 3, context))
    names = {name: (value, dims) for _, name, value, dims in context.metrics.calls}
    for stage in ("HandlerPreprocessMs", "HandlerInferenceMs", "HandlerPostprocessMs"):
        assert names[stage][0] > 0
    assert names["HandlerBatches"][1]["BatchSize"] == "3" and names["HandlerItems"][0] == 3


@pytest.mark.parametrize("case", image_cases.costly_containers(), ids=lambda case: case.name)
def test_containers_that_cost_seconds_to_parse_are_refused_at_once(case):
    """Was: 200 after 0.2-5 s of PIL / libjpeg work for files of 40 KB to 2 MB (seconds per
    megabyte: 16 MB of empty PNG chunks cost ~14 s); now refused from the bytes before PIL parses them."""
    started = time.perf_counter()
    with pytest.raises(BadInput, match=case.words):
        decode_image(case.body, ImageSettings())
    assert time.perf_counter() - started < 0.1


def test_a_progressive_jpeg_with_a_thumbnail_and_profile_is_decoded():
    """Real files carry a few dozen segments and about 10 scans (an EXIF thumbnail's included)."""
    photo_ = image_bytes.photo().resize((320, 240))
    thumbnail = image_bytes.encode(photo_.resize((80, 60)), "JPEG")
    exif = Image.Exif()
    exif[0x010F] = "camera"
    body = image_bytes.encode(photo_, "JPEG", progressive=True, exif=exif.tobytes(), icc_profile=b"\0" * 200_000,
                              comment=thumbnail)
    assert decode_image(body, ImageSettings()).shape == (224, 224, 3)
