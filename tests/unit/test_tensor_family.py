"""The tensor family on a tiny random-weight MLP (tests/tiny.py): the three request forms give one
answer, the outputs their declared shapes and agree with each other; bad requests refused by field.
The trained digits model's answers on its held-out scans: tests/archives."""

import io
import json

import numpy as np
import pytest

from build.examples import worker_input
from handlers.errors import BadInput, PayloadTooLarge, UnsupportedMediaType
from handlers.families.tensor import NPY, TensorSettings, decode_tensor
from tests.references import decoded
from tests.tiny import TENSOR_LABELS

from .conftest import make_handler

pytestmark = pytest.mark.unit

SETTINGS = TensorSettings(shape=(1, 2, 2), dtype="float32", min=0, max=16, max_elements=8)
# Inputs of the tiny model's shape [1, 4, 4], values within its 0..16.
SCAN = np.arange(16, dtype=np.float32).reshape(1, 4, 4)
OTHER = np.full((1, 4, 4), 16.0, dtype=np.float32) - SCAN


@pytest.fixture(scope="module")
def tiny(tiny_dirs):
    return make_handler(tiny_dirs["tiny_tensor"], "tiny_tensor")


def npy(array) -> bytes:
    out = io.BytesIO()
    np.save(out, np.asarray(array))
    return out.getvalue()


def answer(handler, context, body: bytes, content_type: str):
    context.headers, context.statuses = {0: {"Content-Type": content_type}}, {}
    result = decoded(handler.handle([{"body": worker_input(body, content_type)}], context))[0]
    assert not context.statuses, context.statuses
    return result


def test_three_request_forms_one_answer(tiny):
    handler, context = tiny
    forms = [(json.dumps({"inputs": SCAN.tolist()}).encode(), "application/json"),
             (json.dumps({"data": SCAN.reshape(-1).tolist(), "shape": [1, 4, 4], "dtype": "float32"}).encode(),
              "application/json"),
             (npy(SCAN), NPY)]
    answers = [answer(handler, context, body, ctype) for body, ctype in forms]
    assert answers[0] == answers[1] == answers[2]
    top_k = handler.settings.family_settings.top_k
    assert len(answers[0]) == top_k and set(answers[0]) <= set(TENSOR_LABELS)  # top_k of the entry's labels


def test_raw_and_argmax_outputs(tiny_dirs, tiny):
    """raw: the model's outputs, one per label; argmax: the label of the largest; softmax_topk: that
    label first, with its softmax probability."""
    for scan in (SCAN, OTHER):
        body = json.dumps({"inputs": scan.tolist()}).encode()
        raw, context = make_handler(tiny_dirs["tiny_tensor"], "tiny_tensor", tensor={"output": "raw"})
        outputs = np.array(answer(raw, context, body, "application/json")["outputs"])
        assert outputs.shape == (len(TENSOR_LABELS),)
        best = TENSOR_LABELS[int(np.argmax(outputs))]
        top, context = make_handler(tiny_dirs["tiny_tensor"], "tiny_tensor", tensor={"output": "argmax"})
        assert answer(top, context, body, "application/json") == {"class": best}
        probabilities = answer(*tiny, body, "application/json")
        softmax = np.exp(outputs - outputs.max()) / np.exp(outputs - outputs.max()).sum()
        assert list(probabilities)[0] == best and abs(probabilities[best] - softmax.max()) < 1e-5


@pytest.mark.parametrize("body, content_type, error, words", [
    ({"inputs": [[[1, 2], [3, 4]]]}, "", None, ""),
    ({"inputs": [[[1, 2], [3]]]}, "", BadInput, "ragged"),
    ({"inputs": [[[1, 2], [3, 40]]]}, "", BadInput, "above max 16"),
    ({"inputs": [[[1, 2], [3, -1]]]}, "", BadInput, "below min 0"),
    ({"inputs": [[1, 2, 3, 4]]}, "", BadInput, "shape: got [1, 4]"),
    ({"inputs": [[[1, 2], [3, "x"]]]}, "", BadInput, "not a number"),
    ({"data": [1, 2, 3], "shape": [1, 2, 2]}, "", BadInput, "do not fill shape"),
    ({"data": list(range(9)), "shape": [9]}, "", BadInput, "9 elements, over the limit of 8"),
    ({"data": [1, 2, 3, 4], "shape": [1, 2, 2], "dtype": "int64"}, "", BadInput, "dtype: 'int64'"),
    ({"inputs": [[[1, 2], [3, 4]]], "extra": 1}, "", BadInput, "unknown field 'extra'"),
    (b'{"inputs": [[[1, 2], [3, NaN]]]}', "application/json", BadInput, "NaN"),
    (b"<xml/>", "application/xml", UnsupportedMediaType, "not supported"),
    (b"x" * (16 * 1024 * 1024 + 1), "application/json", PayloadTooLarge, "over the limit"),
    (npy(np.array([{"a": 1}], dtype=object)), NPY, BadInput, "object arrays are refused"),
])
def test_decode_names_what_is_wrong(body, content_type, error, words):
    if error is None:
        assert decode_tensor(body, content_type, SETTINGS).shape == (1, 2, 2)
        return
    with pytest.raises(error) as refused:
        decode_tensor(body, content_type, SETTINGS)
    assert words in refused.value.message


def test_integer_models_refuse_fractions_and_overflow():
    ints = TensorSettings(shape=(2,), dtype="uint8")
    assert decode_tensor({"inputs": [1.0, 255]}, "", ints).dtype == np.uint8
    with pytest.raises(BadInput, match="fractional"):
        decode_tensor({"inputs": [1.5, 2]}, "", ints)
    with pytest.raises(BadInput, match="outside uint8's range"):
        decode_tensor({"inputs": [1, 256]}, "", ints)


def test_an_error_no_check_foresaw_is_that_requests_500(tiny, monkeypatch, caplog):
    """A fault of ours is a 500 for the request that met it (traceback logged), never a 400; its
    batch-mates are answered."""
    handler, context = tiny
    scan = {"inputs": SCAN.tolist()}
    expected = answer(handler, context, json.dumps(scan).encode(), "application/json")
    decode = handler.family.decode

    def buggy(body, content_type):
        if body == b"trips a bug":
            raise KeyError("a bug of ours")
        return decode(body, content_type)

    monkeypatch.setattr(handler.family, "decode", buggy)
    context.headers, context.statuses = {0: {"Content-Type": "application/octet-stream"}}, {}
    answers = decoded(handler.handle([{"body": b"trips a bug"}, {"body": scan}], context))
    assert context.statuses[0][0] == 500 and answers[0]["code"] == 500 and 1 not in context.statuses
    assert answers[1] == expected
    assert "unexpected error decoding request 0" in caplog.text and "KeyError" in caplog.text


def _npy_declaring(shape: str) -> bytes:
    return npy(np.zeros((1, 4, 4), np.float32)).replace(b"(1, 4, 4)", shape.encode())


DEEP = SCAN.tolist()
for _ in range(900):  # what TorchServe's own parse still hands over as a dict
    DEEP = [DEEP]


@pytest.mark.parametrize("body, content_type, status, words", [
    (npy(SCAN.astype(np.complex64) + 1j), NPY, 400, "complex"),  # was: 200 without the imaginary parts
    (npy(SCAN.astype("<U4")), NPY, 400, "strings"),  # was: 200, the strings parsed as numbers
    (npy(np.zeros((1, 4, 4), "V4")), NPY, 400, "void"),  # was: 500 (ValueError)
    (_npy_declaring("(1000000, 1000000)"), NPY, 400, "elements"),  # was: 500 (MemoryError: 3.6 TiB)
    ({"inputs": np.ones((1, 4, 4), bool).tolist()}, "application/json", 400, "true/false"),  # was: 200 as 1.0
    ({"inputs": (SCAN.astype(np.float64) * 1e38).tolist()}, "application/json", 400, "overflows float32"),  # was: 200 on infinities
    ({"inputs": SCAN.tolist(), "pad": "x" * (17 * 1024 * 1024)}, "application/json", 413, "over the limit"),
    ({"inputs": DEEP}, "application/json", 400, "nested"),  # was: 400 "ragged nesting"
])
def test_hostile_requests_fail_alone(tiny, body, content_type, status, words):
    """Each a 4xx naming what is wrong, its batch-mate answered as alone (the hostile forms a client
    sends to the digits model: tests/unit/test_arrays.py holds the properties)."""
    handler, context = tiny
    good = json.dumps({"inputs": SCAN.tolist()}).encode()
    expected = answer(handler, context, good, "application/json")
    context.headers = {0: {"Content-Type": content_type}, 1: {"Content-Type": "application/json"}}
    context.statuses = {}
    answers = decoded(handler.handle([{"body": body}, {"body": worker_input(good, "application/json")}], context))
    assert context.statuses.get(0, (200,))[0] == status and words in answers[0]["message"], answers[0]
    assert 1 not in context.statuses and answers[1] == expected
