"""Tensors in, tensors (or classes) out: for any model that takes one array per request.

A request is JSON `{"inputs": <nested list>}`, JSON `{"data": [flat values], "shape": [...],
"dtype": "float32"}`, or a NumPy `.npy` file (`application/x-npy`, never unpickled). The entry
declares one item's shape (without the batch dimension), its dtype, an optional value range and
an element limit; every violation is a 400 naming the field. The answer is the raw output as JSON,
or `argmax` / `softmax_topk` over labels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from handlers.arrays import in_dtype, json_array, npy_array
from handlers.errors import BadInput
from handlers.families import tensor_cases
from handlers.families.base import Family
from handlers.families.cases import Case
from handlers.families.labels import class_names, load_labels, top_k, top_k_disagreement, top_k_problem
from handlers.families.tensor_settings import NPY, TensorSettings
from handlers.json_body import check_size, read_json

_FORMS = 'send {"inputs": <nested list>}, {"data": [...], "shape": [...], "dtype": "..."}, or an .npy file'


def _array(body: Any, content_type: str, settings: TensorSettings) -> tuple[np.ndarray, str]:
    """The request as an array (before its shape, dtype and values are checked) and the field it came in."""
    if isinstance(body, (bytes, bytearray)) and content_type == NPY:
        check_size(body, settings.max_body_bytes)
        return npy_array(bytes(body), settings.max_elements), "array"
    body = read_json(body, content_type, settings.max_body_bytes, _FORMS)
    if not isinstance(body, dict):
        raise BadInput(f"expected a JSON object: {_FORMS}")
    keys = set(body)
    if keys == {"inputs"}:
        return json_array(body["inputs"], "inputs", settings.max_elements), "inputs"
    if keys == {"data", "shape", "dtype"} or keys == {"data", "shape"}:
        shape = body["shape"]
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                  for s in shape):
            raise BadInput(f"shape: a list of non-negative integers, got {shape!r}"[:200])
        dtype = body.get("dtype", settings.dtype)
        if dtype != settings.dtype:
            raise BadInput(f"dtype: {str(dtype)[:40]!r}, the model takes {settings.dtype!r}")
        data = json_array(body["data"], "data", settings.max_elements)
        if data.ndim != 1:
            raise BadInput(f"data: a flat list of values, got {data.ndim} levels of nesting")
        if data.size != math.prod(shape):
            raise BadInput(f"data: {data.size} values do not fill shape {shape} ({math.prod(shape)})")
        return data.reshape(shape), "data"
    extra = sorted(keys - {"inputs", "data", "shape", "dtype"})
    raise BadInput(f"unknown field {extra[0]!r}: {_FORMS}"[:300] if extra else f"fields {sorted(keys)}: {_FORMS}")


def decode_tensor(body: Any, content_type: str, settings: TensorSettings) -> np.ndarray:
    array, field = _array(body, content_type, settings)
    if array.size > settings.max_elements:
        raise BadInput(f"{array.size} elements, over the limit of {settings.max_elements}")
    if tuple(array.shape) != settings.shape:
        raise BadInput(f"shape: got {list(array.shape)}, the model takes {list(settings.shape)} per request")
    array = in_dtype(array, settings.dtype, field)
    if settings.min is not None and array.size and array.min() < settings.min:
        raise BadInput(f"values: {array.min()} is below min {settings.min}")
    if settings.max is not None and array.size and array.max() > settings.max:
        raise BadInput(f"values: {array.max()} is above max {settings.max}")
    return np.ascontiguousarray(array)


class TensorModel(Family):
    name = "tensor"
    input_kind = "tensor"
    Settings = TensorSettings

    def __init__(self, settings: TensorSettings, model_dir: Path, channels_last: bool = False) -> None:
        super().__init__(settings, model_dir, channels_last)
        self.labels = load_labels(model_dir / settings.labels) if settings.labels else None

    def decode(self, body, content_type: str) -> np.ndarray:
        return decode_tensor(body, content_type, self.settings)

    def collate(self, items: Sequence[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.stack(items))

    def postprocess(self, outputs: torch.Tensor, inputs) -> list[Any]:
        if self.settings.output == "raw":
            return [{"outputs": row} for row in outputs.float().cpu().tolist()]
        labels = class_names(self.labels, outputs.shape[-1], self.name)
        if self.settings.output == "argmax":
            return [{"class": labels[i]} for i in outputs.argmax(dim=-1).tolist()]
        return top_k(outputs, labels, self.settings.top_k)

    def example_batch(self, size: int) -> torch.Tensor:
        s = self.settings
        low = 0.0 if s.min is None else s.min
        high = low + 1.0 if s.max is None else s.max
        values = np.random.default_rng(0).uniform(low, high, (size, *s.shape))
        return torch.from_numpy(values.astype(np.dtype(s.dtype)))

    def gate_kind(self) -> str:
        return "tensor" if self.settings.output == "raw" else "classification"

    @classmethod
    def bad_inputs(cls, settings: TensorSettings) -> list[Case]:
        return cls.stamped(tensor_cases.cases(settings))

    @classmethod
    def answer_problem(cls, settings: TensorSettings, answer) -> Optional[str]:
        if settings.output == "raw":
            ok = isinstance(answer, dict) and isinstance(answer.get("outputs"), list)
            return None if ok else f'expected {{"outputs": [...]}}, got {str(answer)[:80]}'
        if settings.output == "argmax":
            return None if isinstance(answer, dict) and set(answer) == {"class"} else 'expected {{"class": label}}'
        return top_k_problem(answer, settings.top_k)

    @classmethod
    def disagreement(cls, settings: TensorSettings, one, other) -> Optional[str]:
        if settings.output == "softmax_topk":
            return top_k_disagreement(one, other)
        return super().disagreement(settings, one, other)
