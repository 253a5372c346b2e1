"""Running a handler in-process, as a TorchServe worker would, on an extracted archive (fake context);
and the image bytes the tests send it. Shared by tests/unit and tests/archives."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from handlers.handler import Handler
from serving.fake_context import FakeContext


def make_handler(model_dir: Path, name: str, batch_size: int = 4, gpu_id=None, **overrides):
    """The handler TorchServe would run for this extracted archive, initialised in-process;
    `overrides`: handler-section settings changed on top of the archive's (runtime=..., <family>=...);
    `gpu_id`: what TorchServe hands a worker on a GPU host."""
    context = FakeContext(model_dir, name, batch_size=batch_size, handler_overrides=overrides, gpu_id=gpu_id)
    handler = Handler()
    handler.initialize(context)
    return handler, context


def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def png_of(array: np.ndarray, mode: str = None) -> bytes:
    return encode(Image.fromarray(array, mode) if mode else Image.fromarray(array), "PNG")
