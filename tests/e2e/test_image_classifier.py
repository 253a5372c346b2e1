"""efficientnet_lite0 through the real server: raw image bytes in, top-5 ImageNet labels out."""

from __future__ import annotations

import pytest

from benchmarks.load.inputs import CAT_LABELS
from tests.e2e.helpers import assert_bad_request, jpeg_of, pixel_bomb_png, top5

pytestmark = pytest.mark.e2e
MODEL = "efficientnet_lite0"


def test_cat_png(server, cat_png):
    answer = top5(server.predict(MODEL, cat_png.read_bytes(), "image/png"))
    assert next(iter(answer)) in CAT_LABELS, answer


def test_coffee_png_is_espresso(server, coffee_png):
    answer = top5(server.predict(MODEL, coffee_png.read_bytes(), "image/png"))
    assert next(iter(answer)) == "espresso", answer


def test_cat_jpeg(server, cat_png):
    answer = top5(server.predict(MODEL, jpeg_of(cat_png), "image/jpeg"))
    assert next(iter(answer)) in CAT_LABELS, answer


@pytest.mark.parametrize(
    "kind",
    ["empty", "not-an-image", "truncated-png", "truncated-jpeg", "too-many-pixels"],
)
def test_bad_image_is_400(server, cat_png, kind):
    png = cat_png.read_bytes()
    body, ctype = {
        "empty": (b"", "image/png"),
        "not-an-image": (b"not an image", "image/png"),
        "truncated-png": (png[: len(png) // 3], "image/png"),
        "truncated-jpeg": (jpeg_of(cat_png)[:2000], "image/jpeg"),
        "too-many-pixels": (pixel_bomb_png(), "image/png"),
    }[kind]
    assert_bad_request(server.predict(MODEL, body, ctype))
    # The worker survived: the next good request is answered.
    assert next(iter(top5(server.predict(MODEL, png, "image/png")))) in CAT_LABELS
