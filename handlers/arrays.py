"""Numbers from a request as an array in the model's dtype: JSON lists and NumPy `.npy` files.

Every refusal is a BadInput naming the field (and the first offending value's index): anything but
numbers (strings, null, objects, true/false where the model takes numbers: JSON booleans are not
numbers, even though Python counts them as integers), ragged nesting, NaN or infinity, values the
model's dtype cannot hold (1e39 in float32, 70000 in float16, 256 in uint8, fractions in an integer
type). An `.npy` file is read from its header first (np.lib.format): only boolean, integer and
float dtypes are taken (complex, strings, dates, void, structured and object arrays are refused,
never cast), and its declared shape must fit the element limit and match the bytes sent before
anything is allocated.
"""

from __future__ import annotations

import io
import math
from typing import Optional

import numpy as np

from handlers.errors import BadInput

NUMERIC_KINDS = "biuf"  # boolean, signed and unsigned integer, float
_KIND_NAMES = {"c": "complex numbers", "U": "strings", "S": "byte strings", "V": "raw (void) records",
               "M": "dates", "m": "time deltas", "O": "Python objects"}
_NUMBERS = frozenset({int, float})


def json_array(value: object, field: str, max_elements: Optional[int] = None) -> np.ndarray:
    """A (nested) JSON list of numbers as a bool, int64 or float64 array (bool only when every
    value is true/false), before the model's dtype is applied (`in_dtype`)."""
    if not isinstance(value, list):
        raise BadInput(f"{field}: a (nested) list of numbers, got {type(value).__name__}")
    try:
        objects = np.array(value, dtype=object)
    except ValueError as err:  # nested past NumPy's 64 dimensions
        raise BadInput(f"{field}: {err}"[:200]) from None
    if max_elements is not None and objects.size > max_elements:
        raise BadInput(f"{field}: {objects.size} elements, over the limit of {max_elements}")
    flat = objects.reshape(-1)
    kinds = set(map(type, flat))
    if list in kinds:
        raise BadInput(f"{field}: ragged nesting (rows of different lengths or depths)")
    if kinds == {bool}:
        return flat.astype(np.bool_).reshape(objects.shape)
    if not kinds <= _NUMBERS:
        bad = next(i for i, v in enumerate(flat) if type(v) not in _NUMBERS)
        what = "true/false among numbers" if isinstance(flat[bad], bool) else f"{_json_name(flat[bad])}, not a number"
        raise BadInput(f"{field}{_index(bad, objects.shape)}: {what}")
    try:
        numbers = flat.astype(np.int64 if kinds == {int} else np.float64)
    except OverflowError:  # an integer past 64 bits, or past float64's range
        numbers = _wide(flat, field, objects.shape)
    return numbers.reshape(objects.shape)


def npy_array(data: bytes, max_elements: int) -> np.ndarray:
    """An `.npy` file's array (native byte order, C order), validated from its header before any
    allocation; never unpickled."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise BadInput(f"not a readable .npy array: format version {version[0]}.{version[1]} (send 1.0 or 2.0)")
    except (ValueError, TypeError, SyntaxError, EOFError, RecursionError, MemoryError, OverflowError) as err:
        raise BadInput(f"not a readable .npy array: {err}"[:300]) from None
    kind = dtype.kind
    if dtype.hasobject:
        raise BadInput("not a readable .npy array: object arrays are refused (they are pickles)")
    if dtype.names is not None or dtype.subdtype is not None or kind not in NUMERIC_KINDS:
        what = "records" if dtype.names is not None else _KIND_NAMES.get(kind, f"dtype {dtype.str}")
        raise BadInput(f"array: .npy of {what} ({dtype.str}): the model takes booleans, integers or floats")
    if any(side < 0 for side in shape):
        raise BadInput(f"array: .npy header declares shape {list(shape)}")
    count = math.prod(shape)
    if count > max_elements:
        raise BadInput(f"array: {count} elements declared, over the limit of {max_elements}")
    start, needed = stream.tell(), count * dtype.itemsize
    if len(data) - start != needed:
        raise BadInput(f"not a readable .npy array: its header declares {list(shape)} {dtype.str} ({needed} bytes), "
                       f"the body holds {len(data) - start} after the header")
    values = np.frombuffer(data, dtype=dtype, count=count, offset=start)
    return np.array(values.reshape(shape, order="F" if fortran else "C"), dtype=dtype.newbyteorder("="), order="C")


def in_dtype(array: np.ndarray, dtype: str, field: str) -> np.ndarray:
    """The array in the model's dtype, or BadInput for a value that type cannot hold as it is."""
    wanted = np.dtype(dtype)
    kind = array.dtype.kind
    if kind not in NUMERIC_KINDS:
        raise BadInput(f"{field}: {array.dtype} values, the model takes {dtype}")
    if kind == "b" and wanted.kind != "b":
        raise BadInput(f"{field}: true/false values, the model takes {dtype} numbers")
    if kind == "f":
        _first(~np.isfinite(array), array, field, "NaN or infinity")
    if wanted.kind == "f":
        top = float(np.finfo(wanted).max)
        _first(np.abs(array.astype(np.float64)) > top, array, field, f"{{:g}} overflows {dtype} (largest {top:.4g})")
        return array.astype(wanted)
    if kind == "f":
        _first(array != np.round(array), array, field, f"{{:g}} is fractional, the model takes {dtype}")
    if wanted.kind == "b":
        _first(~np.isin(array, (0, 1)), array, field, "{:g}: bool takes 0/1 or true/false only")
        return array.astype(wanted)
    info = np.iinfo(wanted)
    # Floats compare with the range's ends as floats: float(2**63 - 1) is 2**63, which int64 cannot hold.
    above = array >= float(info.max) + 1 if kind == "f" else array > info.max
    _first((array < info.min) | above, array, field, f"{{:g}} is outside {dtype}'s range [{info.min}, {info.max}]")
    return array.astype(wanted)


def _first(bad: np.ndarray, array: np.ndarray, field: str, what: str) -> None:
    """Refuse the first value where `bad` holds, by its index; `what` may format the value ({:g})."""
    if array.size and bad.any():
        at = int(np.flatnonzero(bad)[0])
        value = array.reshape(-1)[at]
        raise BadInput(f"{field}{_index(at, array.shape)}: {what.format(value)}"[:300])


def _index(flat: int, shape: tuple[int, ...]) -> str:
    return "".join(f"[{int(i)}]" for i in np.unravel_index(flat, shape)) if shape else ""


def _json_name(value: object) -> str:
    names = {str: "a string", type(None): "null", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _wide(flat: np.ndarray, field: str, shape: tuple[int, ...]) -> np.ndarray:
    """Numbers holding an integer past int64: as float64, refusing one past float64's range."""
    values = np.empty(flat.shape, np.float64)
    for at, value in enumerate(flat):
        try:
            values[at] = float(value)
        except OverflowError:
            raise BadInput(f"{field}{_index(at, shape)}: an integer of {len(str(value))} digits, past float64's "
                           "range") from None
    return values
