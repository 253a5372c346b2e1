"""Cases for a tensor model, made from what its entry declares (shape, dtype, range, limits):
every request form answered, and each way to get one wrong refused with the field it names."""

from __future__ import annotations

import io
import json
import math

import numpy as np

from handlers.families import cases as shared
from handlers.families.cases import Case, invalid, valid
from handlers.families.tensor_settings import NPY, TensorSettings

JSON = "application/json"


def _json(value) -> bytes:
    return json.dumps(value).encode()


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=True)
    return out.getvalue()


def _with_first(array: np.ndarray, value: float, as_written=None) -> list:
    """The array as nested lists with its first value replaced (json writes NaN and Infinity);
    `as_written`: the Python value put there instead (True, an integer past 64 bits)."""
    changed = array.astype(np.float64)
    changed.flat[0] = value
    values = changed.tolist()
    if as_written is not None:
        first = values
        while isinstance(first[0], list):
            first = first[0]
        first[0] = as_written
    return values



def _npy_declaring(array: np.ndarray, shape: tuple[int, ...]) -> bytes:
    """An .npy file holding the array's bytes under a header that declares `shape`."""
    out = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(array.dtype), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue() + np.ascontiguousarray(array).tobytes()


def _hostile(settings: TensorSettings, good: np.ndarray) -> list[Case]:
    """What a hostile client sends: other dtypes in an .npy, headers declaring more than is sent,
    booleans for numbers, values past the model's dtype, deep nesting, JSON over the size limit."""
    dtype = np.dtype(settings.dtype)
    nested = good.tolist()
    out = [
        invalid(".npy of complex numbers", _npy(good.astype(np.complex128) + 1j), NPY, 400, "complex"),
        invalid(".npy of numbers written as strings", _npy(good.astype(np.float64).astype("<U8")), NPY, 400,
                "strings"),
        invalid(".npy of raw void records", _npy(np.zeros(settings.shape, "V4")), NPY, 400, "void"),
        invalid(".npy of structured records", _npy(np.zeros(settings.shape, [("a", "<f4"), ("b", "<i4")])), NPY, 400,
                "records"),
        invalid(".npy of dates", _npy(np.zeros(settings.shape, "M8[D]")), NPY, 400, "dates"),
        invalid(".npy header declaring 10^12 values", _npy_declaring(good, (10**12,)), NPY, 400, "elements"),
        invalid(".npy header declaring more values than it holds", _npy_declaring(good, (good.size + 1,)), NPY, 400,
                "npy"),
        invalid(".npy with bytes past its data", _npy(good) + b"\0" * dtype.itemsize, NPY, 400, "npy"),
        valid(".npy of the declared dtype, big-endian", _npy(good.astype(dtype.newbyteorder(">"))), NPY),
        invalid("inputs nested 100 levels deep", _json({"inputs": shared.nested(nested, 100)}), JSON, 400, "nested"),
        invalid("JSON over the body limit", _json({"inputs": nested, "pad": "x" * settings.max_body_bytes}), JSON, 413,
                "limit"),
    ]
    if dtype.kind != "b":
        out.append(invalid("true/false for numbers", _json({"inputs": np.ones(settings.shape, bool).tolist()}), JSON,
                           400, "true/false"))
        out.append(invalid("one true among numbers", _json({"inputs": _with_first(good, 0.0, True)}), JSON, 400,
                           "true/false"))
    if dtype.kind == "f" and dtype.itemsize < 8:
        past = float(np.finfo(dtype).max) * 2
        out.append(invalid(f"a value past {settings.dtype}'s range", _json({"inputs": _with_first(good, past)}),
                           JSON, 400, "overflows"))
    if dtype.kind in "iu":
        past = int(np.iinfo(dtype).max) + 1
        out.append(invalid(f"a value past {settings.dtype}'s range", _json({"inputs": _with_first(good, past, past)}),
                           JSON, 400, "range"))
    if len(settings.shape) > 1:
        out.append(valid(".npy in Fortran order", _npy(np.asfortranarray(good)), NPY))
    return out


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
    out += _hostile(settings, good)
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
