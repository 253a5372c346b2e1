"""Numbers from requests in the model's dtype (handlers/arrays.py), through the tensor family.

Properties: any `.npy` header (any dtype, shape, order, version, body length) is an array of the
model's shape and dtype or a 4xx, never another exception and never an allocation the body does
not back; any JSON value is the same numbers in the model's dtype or a 4xx naming the field, and
what is accepted holds numbers only (no booleans, strings, NaN, infinity, or values past the dtype).
"""

import io
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.arrays import in_dtype, json_array
from handlers.errors import BadInput, HandlerError
from handlers.families.tensor import decode_tensor
from handlers.families.tensor_settings import NPY, TensorSettings
from tests.unit.conftest import fuzz_examples

from .test_fuzz_inputs import FUZZ

pytestmark = pytest.mark.unit

DESCRS = ["<f4", ">f4", "<f8", ">f8", "<f2", "|b1", "<i8", ">i2", "|u1", "<u8", "<c8", "<c16", "<U3", "|S4", "|V4",
          "<M8[D]", "<m8[s]", "|O", [("a", "<f4")], [("a", "<i4"), ("b", "<f8")], "<f16"]
MODELS = [TensorSettings(shape=(2, 3), dtype=dtype, max_elements=1000) for dtype in ("float32", "float16", "int16",
                                                                                      "uint8", "bool")]


def header(descr, shape, fortran: bool, version: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    fields = {"descr": descr, "fortran_order": fortran, "shape": shape}
    if version == (1, 0):
        np.lib.format.write_array_header_1_0(out, fields)
    else:
        np.lib.format.write_array_header_2_0(out, fields)
    data = out.getvalue()
    return data if version in ((1, 0), (2, 0)) else data[:6] + bytes(version) + data[8:]


def check(body, content_type: str, model: TensorSettings) -> np.ndarray | None:
    try:
        array = decode_tensor(body, content_type, model)
    except HandlerError as err:
        assert 400 <= err.status < 500 and err.message.strip(), err.message
        return None
    assert array.shape == model.shape and array.dtype == np.dtype(model.dtype)
    if array.dtype.kind == "f":
        assert np.isfinite(array).all()
    return array


@FUZZ
@given(model=st.sampled_from(MODELS), descr=st.sampled_from(DESCRS),
       shape=st.sampled_from([(2, 3), (3, 2), (6,)]) | st.lists(st.integers(0, 4) | st.integers(-2, 10**13),
                                                                max_size=3).map(tuple),
       fortran=st.booleans(), version=st.sampled_from([(1, 0), (2, 0), (3, 0), (9, 9)]),
       extra=st.integers(-8, 8), data=st.data())
def test_any_npy_header_is_an_array_or_a_4xx(model, descr, shape, fortran, version, extra, data):
    itemsize = np.dtype(descr).itemsize if not isinstance(descr, str) or descr != "|O" else 8
    declared = math.prod(shape) * itemsize if all(s >= 0 for s in shape) else 0
    length = max(0, min(declared, 4096) + extra)  # what the body holds: the header's bytes or near them
    body = header(descr, shape, fortran, version) + data.draw(st.binary(min_size=length, max_size=length))
    if check(body, NPY, model) is not None:  # numbers only: never complex, strings, dates or records cast
        assert np.dtype(descr).kind in "biuf" and np.dtype(descr).names is None, descr


@FUZZ
@given(model=st.sampled_from(MODELS),
       values=st.lists(st.lists(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=2),
                                min_size=3, max_size=3), min_size=2, max_size=2))
def test_any_json_values_are_those_numbers_or_a_4xx(model, values):
    array = check({"inputs": values}, "application/json", model)
    if array is None:
        return
    leaves = [v for row in values for v in row]
    if model.dtype == "bool":
        assert all(v in (0, 1) for v in leaves)
        return
    assert all(type(v) in (int, float) and math.isfinite(v) for v in leaves), leaves
    np.testing.assert_allclose(array.astype(np.float64), np.array(values, dtype=np.float64), rtol=1e-3)


def npy(array) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


FLOATS = TensorSettings(shape=(2,), dtype="float32")


@pytest.mark.parametrize("body, content_type, words", [
    (npy(np.array([1 + 2j, 3 + 4j])), NPY, "complex"),  # was: 200, the imaginary parts dropped
    (npy(np.array(["1.5", "2"], dtype="<U3")), NPY, "strings"),  # was: 200, parsed as numbers
    (npy(np.array([b"1", b"2"])), NPY, "byte strings"),
    (npy(np.zeros(2, dtype="V4")), NPY, "void"),  # was: 500 (ValueError)
    (npy(np.zeros(2, dtype=[("a", "<f4")])), NPY, "records"),  # was: 200
    (npy(np.array(["2020-01-01", "2020-01-02"], dtype="M8[D]")), NPY, "dates"),  # was: 200
    (npy(np.zeros(2, np.float32)).replace(b"(2,)", b"(1000000000000,)"), NPY, "elements"),  # was: 500 (MemoryError)
    (npy(np.array([1e39, 1.0])), NPY, "array[0]: 1e+39 overflows float32"),  # was: 200 with inf
    ({"inputs": [True, False]}, "application/json", "true/false"),  # was: 200 as 1.0, 0.0
    ({"inputs": [1.5, True]}, "application/json", "inputs[1]: true/false"),
    ({"inputs": [1e39, 1.0]}, "application/json", "inputs[0]: 1e+39 overflows float32"),  # was: 200 with inf
    ({"inputs": ["1", 2]}, "application/json", "inputs[0]: a string"),
])
def test_hostile_arrays_are_refused_naming_what_is_wrong(body, content_type, words):
    with pytest.raises(BadInput) as refused:
        decode_tensor(body, content_type, FLOATS)
    assert words in refused.value.message, refused.value.message


@pytest.mark.parametrize("values, dtype, words", [
    ([70000.0, 1.0], "float16", "70000 overflows float16"),
    ([2**63, 1], "int64", "outside int64's range"),
    ([256, 1], "uint8", "256 is outside uint8's range"),
    ([1.5, 1], "int16", "1.5 is fractional"),
    ([2, 1], "bool", "bool takes 0/1"),
    ([10**400, 1], "float64", "past float64's range"),
])
def test_values_the_models_dtype_cannot_hold_are_refused(values, dtype, words):
    with pytest.raises(BadInput, match=words):
        in_dtype(json_array(values, "v"), dtype, "v")


def test_big_endian_and_fortran_files_read_as_their_values():
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    model = TensorSettings(shape=(2, 3))
    for array in (values.astype(">f4"), np.asfortranarray(values), values.astype("<i2")):
        np.testing.assert_array_equal(decode_tensor(npy(array), NPY, model), values)


@settings(FUZZ, max_examples=fuzz_examples(50))
@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=3))
def test_json_nesting_gives_the_array_its_shape(shape):
    values = np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
    assert json_array(values.tolist(), "inputs").shape == tuple(shape)
