"""Image classifiers: a JPEG or PNG in, the top-k classes with their probabilities out.

Any CNN whose input is one normalised image (N, C, H, W): the catalogue entry's source gives the
architecture and weights; these settings give the geometry (resize the shorter side, centre-crop a
square), the channels, the normalisation and the labels.

A batch stays uint8 until the model: the normalisation is the served module's first step (`wrap`:
a forward pre-hook with its own buffers, so the model's weights and their names stay its own), so on
a GPU a quarter of the bytes cross to the device and the arithmetic runs there; exported variants
(TorchScript, ONNX) carry it in their graph and take uint8 too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from handlers.families import image_cases
from handlers.families.base import Family
from handlers.families.cases import Case
from handlers.families.image_decode import decode_image
from handlers.families.image_settings import ImageSettings
from handlers.families.labels import class_names, load_labels, top_k, top_k_disagreement, top_k_problem


class ImageClassifier(Family):
    name = "image_classifier"
    input_kind = "bytes"
    Settings = ImageSettings
    naive = {"draft_decode": False}
    request_content_type = "image/jpeg"
    stock_baseline = "image"

    def __init__(self, settings: ImageSettings, model_dir: Path, channels_last: bool = False) -> None:
        super().__init__(settings, model_dir, channels_last)
        self.labels = load_labels(model_dir / settings.labels) if settings.labels else None

    def decode(self, body, content_type: str) -> np.ndarray:
        return decode_image(body, self.settings)

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return normalised(model, self.settings.mean, self.settings.std)

    def collate(self, items: Sequence[np.ndarray]) -> torch.Tensor:
        # NHWC uint8 -> an NCHW view whose memory is channels_last already (made contiguous NCHW
        # while still uint8, when the model runs in that layout).
        batch = torch.from_numpy(np.stack(items)).permute(0, 3, 1, 2)
        return batch if self.channels_last else batch.contiguous()

    def postprocess(self, outputs: torch.Tensor, inputs) -> list[dict]:
        return top_k(outputs, class_names(self.labels, outputs.shape[-1], self.name), self.settings.top_k)

    def example_batch(self, size: int) -> torch.Tensor:
        s = self.settings
        pixels = np.random.default_rng(0).integers(0, 256, (size, s.image_size, s.image_size, s.channels), np.uint8)
        return self.collate(list(pixels))

    def gate_kind(self) -> str:
        return "classification"

    @classmethod
    def bad_inputs(cls, settings: ImageSettings) -> list[Case]:
        return cls.stamped(image_cases.cases())

    @classmethod
    def answer_problem(cls, settings: ImageSettings, answer) -> Optional[str]:
        return top_k_problem(answer, settings.top_k)

    @classmethod
    def disagreement(cls, settings: ImageSettings, one, other) -> Optional[str]:
        return top_k_disagreement(one, other)


def normalised(model: torch.nn.Module, mean: Sequence[float], std: Sequence[float]) -> torch.nn.Module:
    """The classifier, taking uint8 pixels: (pixels - mean) / std first, on the model's device and in
    its layout (the float copy keeps the batch's memory format)."""
    shape = (1, -1, 1, 1)
    # Not in the state dict: the settings hold them, and the archive's weights stay the model's own.
    model.register_buffer("pixel_mean", torch.tensor(mean, dtype=torch.float32).reshape(shape), persistent=False)
    model.register_buffer("pixel_std", torch.tensor(std, dtype=torch.float32).reshape(shape), persistent=False)
    model.register_forward_pre_hook(_normalise)
    return model


def _normalise(module: torch.nn.Module, args: tuple) -> tuple:
    pixels, *rest = args
    return (pixels.float().sub(module.pixel_mean).div(module.pixel_std), *rest)
