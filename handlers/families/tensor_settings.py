"""The tensor family's settings (settings.tensor in the catalogue): read by the family and by its cases."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

from handlers.errors import ConfigError

DType = Literal["float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"]
NPY = "application/x-npy"


@dataclass(frozen=True)
class TensorSettings:
    """settings.tensor: what one item is, and what the answer is."""

    shape: Optional[tuple[int, ...]] = None  # one item, without the batch dimension (required)
    dtype: DType = "float32"
    min: Optional[float] = None  # every value within [min, max] when given
    max: Optional[float] = None
    max_elements: int = 1_000_000
    output: Literal["raw", "argmax", "softmax_topk"] = "raw"
    labels: Optional[str] = None  # archive file for argmax / softmax_topk (a JSON list of names)
    top_k: int = 5
    max_body_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.shape is None or any(side < 1 for side in self.shape):
            raise ConfigError(f"tensor.shape: one item's shape without the batch dimension, sides >= 1, got "
                              f"{self.shape} (e.g. [1, 8, 8])")
        elements = math.prod(self.shape)
        if self.max_elements < elements:
            raise ConfigError(f"tensor.max_elements: {self.max_elements} is below one item ({elements} elements)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ConfigError(f"tensor.min: {self.min} is above tensor.max {self.max}")
        if self.top_k < 1 or self.max_body_bytes < 1:
            raise ConfigError("tensor.top_k and tensor.max_body_bytes must be >= 1")
