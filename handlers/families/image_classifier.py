"""Image classifiers: a JPEG or PNG in, the top-k classes with their probabilities out.

Any CNN whose input is one normalised image (N, C, H, W): the catalogue entry's source gives the
architecture and weights; these settings give the geometry (resize the shorter side, centre-crop a
square), the channels, the normalisation and the labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from handlers.errors import ConfigError
from handlers.families.base import Family
from handlers.families.image_decode import decode_image
from handlers.families.labels import class_names, load_labels, top_k


@dataclass(frozen=True)
class ImageSettings:
    """settings.image_classifier: decoding limits, geometry, normalisation, labels."""

    labels: Optional[str] = None  # archive file: a JSON list, or {"index": "name, synonyms"}; none: indices
    image_size: int = 224  # the model's square input side
    resize_size: int = 256  # the shorter side is resized to this, then the centre is cropped
    channels: int = 3  # 3: RGB, 1: greyscale
    mean: Tuple[float, ...] = (127.0,)  # in 0..255 pixel units: one value, or one per channel
    std: Tuple[float, ...] = (128.0,)
    top_k: int = 5
    max_body_bytes: int = 16 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    draft_decode: bool = True  # JPEG: DCT-scaled decoding straight to about the target size

    def __post_init__(self) -> None:
        where = "image_classifier"
        for name in ("image_size", "top_k", "max_body_bytes", "max_image_pixels"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{where}.{name}: must be >= 1, got {getattr(self, name)}")
        if self.resize_size < self.image_size:
            raise ConfigError(f"{where}.resize_size: must be >= image_size ({self.image_size}), got "
                              f"{self.resize_size} (the crop is taken from the resized image)")
        if self.channels not in (1, 3):
            raise ConfigError(f"{where}.channels: 1 (greyscale) or 3 (RGB), got {self.channels}")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if len(values) not in (1, self.channels):
                raise ConfigError(f"{where}.{name}: one value or one per channel ({self.channels}), got {list(values)}")
        if min(self.std) <= 0:
            raise ConfigError(f"{where}.std: must be > 0, got {list(self.std)}")


class ImageClassifier(Family):
    name = "image_classifier"
    input_kind = "bytes"
    Settings = ImageSettings
    naive = {"draft_decode": False}

    def __init__(self, settings: ImageSettings, model_dir: Path, channels_last: bool = False) -> None:
        super().__init__(settings, model_dir, channels_last)
        self.labels = load_labels(model_dir / settings.labels) if settings.labels else None
        shape = (1, -1, 1, 1)
        self.mean = torch.tensor(settings.mean, dtype=torch.float32).reshape(shape)
        self.std = torch.tensor(settings.std, dtype=torch.float32).reshape(shape)

    def decode(self, body, content_type: str) -> np.ndarray:
        return decode_image(body, self.settings)

    def collate(self, items: Sequence[np.ndarray]) -> torch.Tensor:
        # NHWC uint8 -> an NCHW view whose memory is channels_last already (made contiguous NCHW
        # while still uint8, when the model runs in that layout); normalised as one batch.
        batch = torch.from_numpy(np.stack(items)).permute(0, 3, 1, 2)
        if not self.channels_last:
            batch = batch.contiguous()
        return batch.float().sub_(self.mean).div_(self.std)

    def postprocess(self, outputs: torch.Tensor, inputs) -> List[dict]:
        return top_k(outputs, class_names(self.labels, outputs.shape[-1], self.name), self.settings.top_k)

    def example_batch(self, size: int) -> torch.Tensor:
        s = self.settings
        pixels = np.random.default_rng(0).integers(0, 256, (size, s.image_size, s.image_size, s.channels), np.uint8)
        return self.collate(list(pixels))

    def gate_kind(self) -> str:
        return "classification"
