"""Unit-test fixtures: real archives (built incrementally), extracted once, handlers in-process."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from serving.fake_context import FakeContext, extract
from serving.repo import CATALOGUE, MODEL_STORE, REPO_ROOT
from build.archive import build_entry
from build.catalogue import Catalogue
from handlers.handler import Handler


@pytest.fixture(scope="session")
def archive_dirs(tmp_path_factory):
    """model name -> folder holding the extracted real archive."""
    catalogue = Catalogue.load(CATALOGUE)
    dirs = {}
    for name in catalogue.names:
        result = build_entry(catalogue, name, REPO_ROOT, MODEL_STORE, progress=lambda _: None)
        dirs[name] = extract(result.archive, tmp_path_factory.mktemp(name))
    return dirs


@pytest.fixture(scope="session")
def eager_archive_dirs(tmp_path_factory):
    """model name -> extracted archive of the same entry exported as an eager state dict
    (the fp32 reference runs from these: a TorchScript archive has its precision baked in)."""
    from benchmarks.bench.inprocess import extracted_archive

    into = tmp_path_factory.mktemp("eager")
    return {name: extracted_archive(name, "eager", into) for name in ("efficientnet_lite0", "minilm")}


def make_handler(model_dir: Path, name: str, batch_size: int = 4, **overrides):
    """The handler TorchServe would run for this extracted archive, initialised in-process;
    `overrides`: handler-section settings changed on top of the archive's (runtime=..., <family>=...)."""
    context = FakeContext(model_dir, name, batch_size=batch_size, handler_overrides=overrides)
    handler = Handler()
    handler.initialize(context)
    return handler, context


@pytest.fixture(scope="session")
def photos():
    import skimage

    data = Path(skimage.__file__).parent / "data"
    return {"cat": (data / "chelsea.png").read_bytes(), "coffee": (data / "coffee.png").read_bytes()}


def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def png_of(array: np.ndarray, mode: str = None) -> bytes:
    return encode(Image.fromarray(array, mode) if mode else Image.fromarray(array), "PNG")
