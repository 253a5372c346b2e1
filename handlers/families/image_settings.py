"""The image classifier family's settings (settings.image_classifier in the catalogue): read by the
family and by the decoder, so they live apart from both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from handlers.errors import ConfigError


@dataclass(frozen=True)
class ImageSettings:
    """settings.image_classifier: decoding limits, geometry, normalisation, labels."""

    labels: Optional[str] = None  # archive file: a JSON list, or {"index": "name, synonyms"}; none: indices
    image_size: int = 224  # the model's square input side
    resize_size: int = 256  # the shorter side is resized to this, then the centre is cropped
    channels: int = 3  # 3: RGB, 1: greyscale
    mean: tuple[float, ...] = (127.0,)  # in 0..255 pixel units: one value, or one per channel
    std: tuple[float, ...] = (128.0,)
    top_k: int = 5
    max_body_bytes: int = 16 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    # Scans in a JPEG (progressive ones have about 10): each is a pass over every pixel's coefficients.
    max_jpeg_scans: int = 32
    # PNG chunks, or JPEG markers and junk bytes before the first scan: PIL reads each in Python.
    max_image_segments: int = 4096
    draft_decode: bool = True  # JPEG: DCT-scaled decoding straight to about the target size

    def __post_init__(self) -> None:
        where = "image_classifier"
        for name in ("image_size", "top_k", "max_body_bytes", "max_image_pixels", "max_jpeg_scans",
                     "max_image_segments"):
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
