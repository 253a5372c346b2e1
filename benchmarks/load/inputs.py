"""Real inputs shared by tests and benchmarks: photos from scikit-image's wheel, and sentences."""

from __future__ import annotations

import io
from functools import lru_cache
from pathlib import Path
from typing import Dict, List

# Colour photographs (real scenes): the cat and the espresso are the ones with known classes.
PHOTO_FILES = ("chelsea.png", "coffee.png", "astronaut.png", "rocket.jpg", "motorcycle_left.png", "retina.jpg")
# What chelsea.png may be called: ImageNet's five domestic cats (classes 281-285).
CAT_LABELS = frozenset({"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"})

SENTENCES: List[str] = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "A woman is playing the violin on a small stage in front of a quiet audience tonight.",
    "TorchServe batches requests from many clients into a single forward pass of the model.",
    "The quarterly report shows revenue growing faster than costs for the third year in a row.",
    "Heavy rain is expected across the northern valleys tomorrow, with flooding likely near rivers.",
    "She forgot her umbrella at the station and walked home through the storm.",
    "How do I reset my password if I no longer have access to my email account?",
    "The recipe calls for two cups of flour, one egg, and a pinch of salt.",
    "Researchers measured the latency of every request and plotted the distribution.",
    "A cat is sleeping on the warm windowsill while the sun sets behind the hills.",
    "Please send the signed contract back to the legal department before Friday noon.",
    "The train to the airport leaves every fifteen minutes from platform four.",
    "Our new espresso machine makes a rich crema in under thirty seconds.",
    "Children were building a sandcastle on the beach while their parents watched.",
]


def data_dir() -> Path:
    import skimage

    return Path(skimage.__file__).parent / "data"


@lru_cache(maxsize=1)
def photo_bytes() -> Dict[str, bytes]:
    """Original files, by name."""
    return {name: (data_dir() / name).read_bytes() for name in PHOTO_FILES}


@lru_cache(maxsize=1)
def photo_jpegs(quality: int = 90) -> Dict[str, bytes]:
    """The photos as clients usually send them: JPEG."""
    from PIL import Image

    out = {}
    for name, raw in photo_bytes().items():
        buffer = io.BytesIO()
        Image.open(io.BytesIO(raw)).convert("RGB").save(buffer, format="JPEG", quality=quality)
        out[name.rsplit(".", 1)[0] + ".jpg"] = buffer.getvalue()
    return out


def requests_for(model: str) -> List[dict]:
    """The real inputs of a model as TorchServe hands them to a handler: photos as JPEG bytes, or
    sentences as {"text": ...}; the in-process measurements and the load generator both use them."""
    if model == "efficientnet_lite0":
        return [{"body": body} for body in photo_jpegs().values()]
    return [{"body": {"text": text}} for text in SENTENCES]
