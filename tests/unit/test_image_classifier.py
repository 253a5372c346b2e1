"""Image handler on the real archive's weights: predictions, every input mode, bad inputs in a batch."""

import numpy as np
import pytest
from PIL import Image

from handlers.image_classifier import ImageClassifier, load_labels

from .conftest import encode, make_handler, png_of

pytestmark = pytest.mark.unit

CAT_CLASSES = {"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"}  # ImageNet 281-285


@pytest.fixture(scope="module")
def served(archive_dirs):
    """The shipped settings (bf16, channels_last)."""
    return make_handler(ImageClassifier, archive_dirs["efficientnet_lite0"], "efficientnet_lite0")


@pytest.fixture(scope="module")
def reference(eager_archive_dirs):
    """fp32 eager, no draft decoding: the reference the optimised path is held to."""
    return make_handler(ImageClassifier, eager_archive_dirs["efficientnet_lite0"], "efficientnet_lite0",
                        runtime={"precision": "fp32", "channels_last": False}, model={"draft_decode": False})


def top1(answer: dict) -> str:
    return max(answer, key=answer.get)


def test_labels_are_real_imagenet_names(archive_dirs):
    labels = load_labels(archive_dirs["efficientnet_lite0"] / "labels.json")
    assert len(labels) == 1000 and len(set(labels)) == 1000
    assert labels[281] == "tabby" and labels[967] == "espresso"


@pytest.mark.parametrize("fixture", ["served", "reference"])
def test_real_photos(request, fixture, photos):
    handler, context = request.getfixturevalue(fixture)
    cat, coffee = handler.handle([{"body": photos["cat"]}, {"body": photos["coffee"]}], context)
    assert top1(cat) in CAT_CLASSES
    assert top1(coffee) == "espresso"
    assert len(cat) == 5 and list(cat.values()) == sorted(cat.values(), reverse=True)
    assert 0.9 < sum(coffee.values()) <= 1.0 + 1e-6


def test_jpeg_draft_decoding_keeps_top1(served, reference, photos):
    jpegs = [encode(Image.open(__import__("io").BytesIO(p)).convert("RGB"), "JPEG", quality=90)
             for p in (photos["cat"], photos["coffee"])]
    big = encode(Image.open(__import__("io").BytesIO(photos["coffee"])).convert("RGB").resize((1600, 1066)), "JPEG")
    for handler, context in (served, reference):
        answers = handler.handle([{"body": b} for b in jpegs + [big]], context)
        assert top1(answers[0]) in CAT_CLASSES
        assert top1(answers[1]) == "espresso" and top1(answers[2]) == "espresso"


def test_top1_agrees_with_fp32_reference(served, reference):
    """Shipped path (TorchScript bf16, channels_last, draft JPEG decoding) vs fp32 eager reference.

    Tolerance: where the reference is decided (top-1 leads top-2 by >= 0.05) the top-1 must be the
    same; where two classes are within 0.05 (the astronaut: 'bobsled' 0.13 vs 'football helmet'
    0.12) bf16 rounding and draft decoding may swap them, so the served top-1 must be one of the two.
    """
    from benchmarks.load.inputs import photo_bytes, photo_jpegs

    photos = {**photo_bytes(), **photo_jpegs()}
    ours = served[0].handle([{"body": b} for b in photos.values()], served[1])
    theirs = reference[0].handle([{"body": b} for b in photos.values()], reference[1])
    decided = 0
    for name, mine, ref in zip(photos, ours, theirs):
        (first, p1), (second, p2) = list(ref.items())[:2]
        if p1 - p2 >= 0.05:
            decided += 1
            assert top1(mine) == first, (name, mine, ref)
        else:
            assert top1(mine) in (first, second), (name, mine, ref)
    assert decided >= 5  # espresso, missile and moped photos, PNG and JPEG


def test_every_valid_mode_is_classified(served, photos):
    import io

    rgb = Image.open(io.BytesIO(photos["coffee"])).convert("RGB")
    grey16 = (np.asarray(rgb.convert("L"), dtype=np.uint16) * 257)
    bodies = {
        "L": encode(rgb.convert("L"), "PNG"),
        "RGBA": encode(rgb.convert("RGBA"), "PNG"),
        "P": encode(rgb.convert("P"), "PNG"),
        "I;16": png_of(grey16),
        "CMYK jpeg": encode(rgb.convert("CMYK"), "JPEG"),
        "grey jpeg": encode(rgb.convert("L"), "JPEG"),
        "1x1": png_of(np.zeros((1, 1, 3), np.uint8)),
    }
    handler, context = served
    answers = handler.handle([{"body": b} for b in bodies.values()], context)
    assert context.statuses == {}
    for mode, answer in zip(bodies, answers):
        assert len(answer) == 5, mode
    assert top1(answers[1]) == "espresso" and top1(answers[5 - 1]) is not None


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
    answers = handler.handle(batch, context)
    assert top1(answers[0]) == "espresso" and top1(answers[-1]) in CAT_CLASSES
    for i, (name, (_, status, words)) in enumerate(BAD.items(), start=1):
        assert context.statuses[i][0] == status, name
        assert answers[i]["code"] == status and words in answers[i]["message"], (name, answers[i])
    assert 0 not in context.statuses and len(batch) - 1 not in context.statuses
    context.statuses.clear()


def test_all_bad_batch_skips_inference(served):
    handler, context = served
    context.metrics.calls.clear()
    answers = handler.handle([{"body": b""}, {"body": b"x"}], context)
    assert [a["code"] for a in answers] == [400, 400]
    assert not any(name == "HandlerInferenceMs" for _, name, _, _ in context.metrics.calls)
    context.statuses.clear()


def test_stage_metrics_emitted(served, photos):
    handler, context = served
    context.metrics.calls.clear()
    handler.handle([{"body": photos["cat"]}] * 3, context)
    names = {name: (value, dims) for _, name, value, dims in context.metrics.calls}
    for stage in ("HandlerPreprocessMs", "HandlerInferenceMs", "HandlerPostprocessMs"):
        assert names[stage][0] > 0
    assert names["HandlerBatches"][1]["BatchSize"] == "3" and names["HandlerItems"][0] == 3
