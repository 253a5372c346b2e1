"""The trained digits model's archive in-process: its held-out scans are read as their digits, in
every request form and output kind."""

import io
import json

import numpy as np
import pytest

from build.examples import worker_input
from handlers.families.tensor import NPY
from tests.references import decoded

from .conftest import make_handler

pytestmark = pytest.mark.archives


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
