"""The tensor family on the shipped digits model: the three request forms give one answer, the
held-out scans their digits, the outputs their declared shapes; bad requests refused by field."""

import io
import json

import numpy as np
import pytest

from build.examples import worker_input
from handlers.errors import BadInput, PayloadTooLarge, UnsupportedMediaType
from handlers.families.tensor import NPY, TensorSettings, decode_tensor
from tests.references import decoded

from .conftest import make_handler

pytestmark = pytest.mark.unit

SETTINGS = TensorSettings(shape=(1, 2, 2), dtype="float32", min=0, max=16, max_elements=8)


@pytest.fixture(scope="module")
def digits(archive_dirs):
    return make_handler(archive_dirs["digits"], "digits")


def npy(array) -> bytes:
    out = io.BytesIO()
    np.save(out, np.asarray(array))
    return out.getvalue()


def answer(handler, context, body: bytes, content_type: str):
    context.headers, context.statuses = {0: {"Content-Type": content_type}}, {}
    result = decoded(handler.handle([{"body": worker_input(body, content_type)}], context))[0]
    assert not context.statuses, context.statuses
    return result


def test_three_request_forms_one_answer(digits, repo_root):
    handler, context = digits
    scan = np.load(repo_root / "models/digits/example_2.npy")
    forms = [(json.dumps({"inputs": scan.tolist()}).encode(), "application/json"),
             (json.dumps({"data": scan.reshape(-1).tolist(), "shape": [1, 8, 8], "dtype": "float32"}).encode(),
              "application/json"),
             (npy(scan), NPY)]
    answers = [answer(handler, context, body, ctype) for body, ctype in forms]
    assert answers[0] == answers[1] == answers[2]
    assert list(answers[0])[0] == "2" and len(answers[0]) == 3  # top_k 3 of the entry's labels


def test_raw_and_argmax_outputs(archive_dirs, repo_root):
    scan = json.dumps({"inputs": np.load(repo_root / "models/digits/example_7.npy").tolist()}).encode()
    raw, context = make_handler(archive_dirs["digits"], "digits", tensor={"output": "raw"})
    outputs = answer(raw, context, scan, "application/json")["outputs"]
    assert len(outputs) == 10 and int(np.argmax(outputs)) == 7
    top, context = make_handler(archive_dirs["digits"], "digits", tensor={"output": "argmax"})
    assert answer(top, context, scan, "application/json") == {"class": "7"}


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


def test_an_error_no_check_foresaw_is_that_requests_500(digits, repo_root, monkeypatch, caplog):
    """A fault of ours is a 500 for the request that met it (traceback logged), never a 400; its
    batch-mates are answered."""
    handler, context = digits
    decode = handler.family.decode

    def buggy(body, content_type):
        if body == b"trips a bug":
            raise KeyError("a bug of ours")
        return decode(body, content_type)

    monkeypatch.setattr(handler.family, "decode", buggy)
    scan = {"inputs": np.load(repo_root / "models/digits/example_6.npy").tolist()}
    context.headers, context.statuses = {0: {"Content-Type": "application/octet-stream"}}, {}
    answers = decoded(handler.handle([{"body": b"trips a bug"}, {"body": scan}], context))
    assert context.statuses[0][0] == 500 and answers[0]["code"] == 500 and 1 not in context.statuses
    assert list(answers[1])[0] == "6"
    assert "unexpected error decoding request 0" in caplog.text and "KeyError" in caplog.text
