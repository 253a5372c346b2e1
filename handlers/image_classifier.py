"""ImageNet classifier (EfficientNet-Lite0): JPEG/PNG in, top-k {label: probability} out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Sequence

import numpy as np
import torch

from handlers import runtime
from handlers.base import ModelHandler
from handlers.image_decode import decode_image
from handlers.settings import ImageSettings


def load_labels(path: Path) -> List[str]:
    """Class names by index: a JSON list, or {"index": "name, synonym, ..."} (first synonym kept).

    ImageNet repeats a few names ("crane" the bird and the machine): those get their class index
    appended, so every label, used as a key of the response, stays unique.
    """
    raw = json.loads(path.read_text(encoding="utf-8"))
    full = raw if isinstance(raw, list) else [raw[str(i)] for i in range(len(raw))]
    short = [name.split(",")[0].strip() for name in full]
    repeated = {name for name in short if short.count(name) > 1}
    return [f"{name} ({i})" if name in repeated else name for i, name in enumerate(short)]


class ImageClassifier(ModelHandler):
    family_settings_type = ImageSettings

    def setup(self, model_dir: Path) -> None:
        family: ImageSettings = self.settings.family
        self.labels = load_labels(model_dir / family.labels)
        self.top_k = min(family.top_k, len(self.labels))

    @classmethod
    def build_model(cls, family: ImageSettings, model_dir: Path) -> torch.nn.Module:
        from efficientnet_lite_pytorch import EfficientNet

        return EfficientNet.from_name(family.architecture)

    def decode(self, body, content_type: str) -> np.ndarray:
        return decode_image(body, self.settings.family)

    def collate(self, items: Sequence[np.ndarray]) -> torch.Tensor:
        family: ImageSettings = self.settings.family
        # NHWC uint8 -> NCHW view whose memory is already channels_last; normalise the whole batch.
        batch = torch.from_numpy(np.stack(items)).permute(0, 3, 1, 2)
        if not self.settings.runtime.channels_last:
            batch = batch.contiguous()
        batch = batch.float().sub_(family.mean).div_(family.std)
        return batch

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(runtime.to_device(inputs, self.device))

    def postprocess(self, outputs: torch.Tensor, inputs) -> List[dict]:
        probabilities, indices = outputs.float().softmax(dim=-1).topk(self.top_k, dim=-1)
        labels = self.labels
        return [
            {labels[i]: round(p, 6) for p, i in zip(row_p, row_i)}
            for row_p, row_i in zip(probabilities.tolist(), indices.tolist())
        ]

    def example_batch(self, batch_size: int) -> torch.Tensor:
        size = self.settings.family.image_size
        pixels = np.random.default_rng(0).integers(0, 256, (batch_size, size, size, 3), dtype=np.uint8)
        return self.collate(list(pixels))
