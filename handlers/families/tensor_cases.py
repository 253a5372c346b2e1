"""Cases for a tensor model, made from what its entry declares (shape, dtype, range, limits):
every request form answered, and each way to get one wrong refused with the field it names."""

from __future__ import annotations

import io
import json
import math

import numpy as np

from handlers.families.cases import Case, invalid, valid
from handlers.families.tensor_settings import NPY, TensorSettings

JSON = "application/json"


def _json(value) -> bytes:
    return json.dumps(value).encode()


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=True)
    return out.getvalue()


def _with_first(array: np.ndarray, value: float) -> list:
    """The array as nested lists with its first value replaced (json writes NaN and Infinity)."""
    changed = array.astype(np.float64)
    changed.flat[0] = value
    return changed.tolist()


def cases(settings: TensorSettings) -> list[Case]:
    shape, dtype = list(settings.shape), np.dtype(settings.dtype)
    low = 0 if settings.min is None else settings.min
    high = low + 1 if settings.max is None else settings.max
    good = np.full(settings.shape, (low + high) / 2 if dtype.kind == "f" else math.floor((low + high) / 2), dtype)
    nested = good.tolist()
    flat = good.reshape(-1).tolist()
    out = [
        valid("nested inputs", _json({"inputs": nested}), JSON),
        valid("flat data with shape and dtype", _json({"data": flat, "shape": shape, "dtype": settings.dtype}),
              JSON),
        valid("flat data with shape", _json({"data": flat, "shape": shape}), JSON),
        valid(".npy of the declared dtype", _npy(good), NPY),
        valid("no content type (JSON)", _json({"inputs": nested}), None),
        invalid("empty body", b"", JSON, 400, "malformed JSON"),
        invalid("malformed JSON", b'{"inputs": [1, 2', JSON, 400, "malformed JSON"),
        invalid("JSON list, not an object", _json(nested), JSON, 400, "JSON object"),
        invalid("unknown field", _json({"inputs": nested, "colour": "red"}), JSON, 400, "colour"),
        invalid("inputs not a list", _json({"inputs": "zeros"}), JSON, 400, "inputs"),
        invalid("strings inside", _json({"inputs": [["a"] * len(flat)]}), JSON, 400, "not a number"),
        invalid("ragged nesting", _json({"inputs": [flat, flat[:-1] or [1, 2]]}), JSON, 400, "ragged"),
        invalid("a batch instead of one item", _json({"inputs": [nested, nested]}), JSON, 400, "shape"),
        invalid("data does not fill the shape", _json({"data": flat[:-1], "shape": shape}), JSON, 400,
                "do not fill"),
        invalid("negative shape", _json({"data": flat, "shape": [-1]}), JSON, 400, "shape"),
        invalid("another dtype named",
                _json({"data": flat, "shape": shape, "dtype": "int8" if settings.dtype != "int8" else "float32"}),
                JSON, 400, "dtype"),
        invalid("NaN", _json({"inputs": _with_first(good, math.nan)}), JSON, 400, "NaN"),
        invalid("too many elements", _json({"data": [0] * (settings.max_elements + 1),
                                                    "shape": [settings.max_elements + 1]}), JSON, 400, "elements"),
        invalid(".npy of objects (a pickle)", _npy(np.array([{"a": 1}], dtype=object)), NPY, 400, "npy"),
        invalid(".npy cut short", _npy(good)[:-3], NPY, 400, "npy"),
        invalid(".npy of another shape", _npy(np.zeros((2, *settings.shape), dtype)), NPY, 400, "shape"),
        invalid("XML", b"<inputs/>", "application/xml", 415, "not supported"),
    ]
    if len(shape) > 1:
        out.append(invalid("one level of nesting too few", _json({"inputs": flat}), JSON, 400, "shape"))
    if dtype.kind == "f":
        out.append(invalid("infinity", _json({"inputs": _with_first(good, math.inf)}), JSON, 400, "infinity"))
    else:
        fractional = (good.astype(np.float64) + 0.5).tolist()
        out.append(invalid("fractions for an integer model", _json({"inputs": fractional}), JSON, 400,
                           "fractional"))
    if settings.max is not None:
        out.append(invalid("a value above max", _json({"inputs": np.full(settings.shape, settings.max + 1)
                                                              .tolist()}), JSON, 400, "above max"))
    if settings.min is not None:
        out.append(invalid("a value below min", _json({"inputs": np.full(settings.shape, settings.min - 1)
                                                               .tolist()}), JSON, 400, "below min"))
    return out
