"""The Open Inference Protocol's binary tensor data extension through the real handler, on tiny
models of the text, image and tensor families (tests/tiny.py).

Requests are built by NVIDIA's tritonclient exactly as it sends them (a JSON header, its length in
`Inference-Header-Content-Length`, then raw tensor bytes; no Content-Type), and answers are read
back with its own parser: a binary request gets the answers of the same request in JSON, binary
outputs hold the numbers JSON outputs hold. Each inconsistency between sizes, shape and datatype,
and each part of the protocol the server does not offer, is a 400 (415) naming the field, answered
alone while its batch-mates are answered.
"""

from __future__ import annotations

import json
import struct
import time

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.http._utils import _get_inference_request

from handlers.binary_tensors import BINARY, HEADER
from tests.unit.test_kserve import KSERVE, Req, _images, _scans, b64, run, v2

from .conftest import make_handler

pytestmark = pytest.mark.unit

MODELS = ["tiny_text", "tiny_image", "tiny_tensor"]
ROUTE = {"explain": "False"}  # what the worker sees from /v2/models/<m>/infer; tritonclient sends no Content-Type
TEXTS = ["A man is eating food.", "Ein Mann isst.", "The new movie is awesome."]


@pytest.fixture(scope="module")
def handlers_(tiny_dirs):
    return {model: make_handler(tiny_dirs[model], model) for model in MODELS}


def client_request(tensor: triton.InferInput, binary_output: bool | None, request_id: str = "r-1") -> Req:
    """The body and headers tritonclient's InferenceServerClient.infer sends for one input.
    binary_output None: no outputs named (the client then asks for every output as binary)."""
    outputs = None if binary_output is None else [triton.InferRequestedOutput("output-0", binary_data=binary_output)]
    body, json_size = _get_inference_request(inputs=[tensor], request_id=request_id, outputs=outputs, sequence_id=0,
                                             sequence_start=False, sequence_end=False, priority=0, timeout=None,
                                             custom_parameters=None)
    headers = dict(ROUTE) if json_size is None else {**ROUTE, HEADER: str(json_size)}
    return Req(body, headers)


def model_input(model: str, photos, count: int = 2) -> tuple[triton.InferInput, np.ndarray]:
    if model == "tiny_text":
        values = np.array([t.encode() for t in TEXTS[:count]], dtype=np.object_)
        return triton.InferInput("text", [count], "BYTES"), values
    if model == "tiny_image":
        values = np.array(_images(photos)[:count], dtype=np.object_)
        return triton.InferInput("image", [count], "BYTES"), values
    values = np.stack(_scans()[:count]).astype(np.float32)
    return triton.InferInput("scan", list(values.shape), "FP32"), values


def output_of(answer) -> np.ndarray:
    """output-0 as tritonclient reads it; BYTES elements as text (binary BYTES come back as bytes)."""
    array = result_of(answer).as_numpy("output-0")
    if array.dtype == np.object_:
        return np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else v, otypes=[object])(array)
    return array


def result_of(answer) -> triton.InferResult:
    """The answer as tritonclient reads it (it takes the JSON header's length from the response header)."""
    assert answer.status == 200, answer.raw[:300]
    length = (answer.headers or {}).get(HEADER)
    return triton.InferResult.from_response_body(answer.raw, header_length=None if length is None else int(length))


@pytest.mark.parametrize("model", MODELS)
def test_binary_inputs_and_outputs_answer_like_json(handlers_, photos, model):
    """Binary or JSON inputs x binary or JSON outputs: the same output tensor, in one batch; the JSON
    form is what the image family's JSON BYTES take (base64), the binary form the raw bytes."""
    handler, context = handlers_[model]
    tensor, values = model_input(model, photos)
    json_in = v2("BYTES", [2], [b64(v) for v in values]) if model == "tiny_image" else None
    if json_in is None:
        tensor.set_data_from_numpy(values, binary_data=False)
        json_in = client_request(tensor, binary_output=False)
    tensor.set_data_from_numpy(values, binary_data=True)
    batch = [json_in, client_request(tensor, binary_output=False), client_request(tensor, binary_output=True),
             client_request(tensor, binary_output=None)]
    answers = run(handler, context, batch)
    assert [a.status for a in answers] == [200] * 4, [a.raw[:200] for a in answers]
    reference = output_of(answers[0])
    for answer in answers[1:]:
        got = output_of(answer)
        assert got.shape == reference.shape and got.dtype == reference.dtype
        assert np.array_equal(got, reference), model
    for answer, binary in zip(answers[1:], (False, True, True)):
        assert (HEADER in answer.headers) == binary
        assert answer.content_type == (BINARY if binary else "application/json")
        if binary:  # the JSON header then exactly the tensor's bytes
            header = json.loads(answer.raw[:int(answer.headers[HEADER])])
            (output,) = header["outputs"]
            assert "data" not in output
            assert output["parameters"]["binary_data_size"] == len(answer.raw) - int(answer.headers[HEADER])


def test_binary_embeddings_are_the_json_numbers(handlers_):
    """FP32 embeddings as binary: float32 little-endian, equal to the JSON numbers."""
    handler, context = handlers_["tiny_text"]
    tensor, values = model_input("tiny_text", None, count=3)
    tensor.set_data_from_numpy(values)
    as_json, as_binary = run(handler, context, [v2("BYTES", [3], TEXTS), client_request(tensor, binary_output=True)])
    numbers = np.asarray(as_json.json["outputs"][0]["data"], dtype=np.float32).reshape(3, -1)
    assert np.array_equal(output_of(as_binary), numbers)


def packed(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def binary(tensor: dict, tail: bytes, header_length: int | str | None = None, **payload) -> Req:
    head = json.dumps({"inputs": [tensor], **payload}).encode()
    declared = len(head) if header_length is None else header_length
    return Req(head + tail, {**ROUTE, HEADER: str(declared)})


def text_tensor(tail: bytes, shape=(1,), size=None, **parameters) -> dict:
    return {"name": "text", "shape": list(shape), "datatype": "BYTES",
            "parameters": {"binary_data_size": len(tail) if size is None else size, **parameters}}


def scan_tensor(tail: bytes, datatype="FP32", shape=(1, 1, 4, 4), **parameters) -> dict:
    return {"name": "scan", "shape": list(shape), "datatype": datatype,
            "parameters": {"binary_data_size": len(tail), **parameters}}


ONE = packed(b"fine")
SHORT = struct.pack("<I", 3) + b"ab"
SCAN = np.zeros((1, 1, 4, 4), "<f4").tobytes()
FLOATS_AS_TEXT = json.dumps({"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES",
                                         "parameters": {"binary_data_size": 8}}]}).encode() + b"\x00\x00\x80?" * 2
BAD = {
    "tiny_text": [
        (binary(text_tensor(ONE), ONE, header_length="12a"), 400, f"{HEADER}: '12a' is not a byte count"),
        (binary(text_tensor(ONE), ONE, header_length=10_000), 400, f"{HEADER}: 10000 bytes of JSON header, the body has"),
        (binary(text_tensor(ONE), ONE, header_length=5), 400, f"{HEADER}: the first 5 bytes are not a JSON object"),
        (binary(text_tensor(ONE, size=4), ONE), 400, "inputs[0].parameters.binary_data_size: 4, but 8 bytes follow"),
        (binary(text_tensor(ONE, size=-1), ONE), 400, "binary_data_size: a non-negative integer, got -1"),
        (binary(text_tensor(SHORT), SHORT), 400, "inputs[0]: element 0 declares 3 bytes, 2 are left"),
        (binary(text_tensor(struct.pack("<I", 10**6) + b"ab"), struct.pack("<I", 10**6) + b"ab"), 400,
         "inputs[0]: element 0 declares 1000000 bytes, 2 are left"),
        (binary(text_tensor(ONE, shape=(2,)), ONE), 400, "the shape declares 2 elements, the binary data holds 1"),
        (binary(text_tensor(ONE + ONE), ONE + ONE), 400, "8 bytes left after the 1 elements the shape declares"),
        (binary(text_tensor(ONE + b"\x01", shape=(2,)), ONE + b"\x01"), 400,
         "inputs[0]: element 1: 1 bytes left, a 4-byte length expected"),
        (binary(text_tensor(packed(b"\xff\xfe")), packed(b"\xff\xfe")), 400, "inputs[0]: element 0 is not UTF-8 text"),
        (binary({**text_tensor(ONE), "data": ["fine"]}, ONE), 400, 'inputs[0]: both "data" and parameters.binary_data_size'),
        (Req({"inputs": [text_tensor(ONE)]}, KSERVE), 400,
         f"binary data needs the {HEADER} request header"),
        (binary({"name": "t", "shape": [1], "datatype": "BYTES", "data": ["x"]}, ONE), 400,
         "8 bytes follow the JSON header, but no input declares parameters.binary_data_size"),
        (binary(text_tensor(ONE, shared_memory_region="r"), ONE), 400,
         "inputs[0].parameters.shared_memory_region: the shared-memory extension is not supported"),
        (binary(text_tensor(ONE), ONE, outputs=[{"name": "output-0", "parameters": {"class_count": 3}}]), 400,
         "outputs[0].parameters.class_count: the classification extension is not supported"),
        (binary(text_tensor(ONE), ONE, outputs=[{"name": "logits"}]), 400,
         "outputs[0].name: 'logits': this model's only output is \"output-0\""),
        (binary(text_tensor(ONE), ONE, outputs=[{"name": "output-0", "parameters": {"binary_data": "yes"}}]), 400,
         "outputs[0].parameters.binary_data: true or false"),
        (binary(text_tensor(ONE), ONE, parameters={"sequence_id": 7}), 400, "parameters.sequence_id: sequences"),
        (binary(text_tensor(ONE), ONE, parameters={"binary_data_output": 1}), 400,
         "parameters.binary_data_output: true or false"),
        (binary({**text_tensor(ONE), "datatype": "BF16"}, ONE), 400, "inputs[0].datatype: 'BF16' is not one of"),
        (binary(text_tensor(ONE), ONE, instances=["x"]), 400, "either"),
        (Req(b'{"instances": ["x"]}', {**ROUTE, HEADER: "20"}), 400, f'{HEADER}: binary tensors are'),
        # A binary body without the header is never read as text (it used to be embedded whole).
        (Req(FLOATS_AS_TEXT, ROUTE), 400, "body: a KServe route takes a JSON object"),
        (Req(b"\x1f\x8b\x08\x00", {**ROUTE, "Content-Encoding": "gzip"}), 415, "Content-Encoding: 'gzip'"),
    ],
    "tiny_tensor": [
        (binary(scan_tensor(SCAN[:-4]), SCAN[:-4]), 400,
         "inputs[0].parameters.binary_data_size: 60 bytes, shape [1, 1, 4, 4] of FP32 takes 64"),
        (binary(scan_tensor(SCAN, "FP64"), SCAN), 400, "64 bytes, shape [1, 1, 4, 4] of FP64 takes 128"),
        (binary(scan_tensor(b"\x02" * 16, "BOOL"), b"\x02" * 16), 400, "inputs[0]: BOOL takes bytes 0 and 1 only"),
        (binary(scan_tensor(np.full(16, np.nan, "<f4").tobytes()), np.full(16, np.nan, "<f4").tobytes()), 400,
         "NaN or infinity"),
        (binary(scan_tensor(SCAN, shape=(1, 1, 4, 5)), SCAN), 400, "64 bytes, shape [1, 1, 4, 5] of FP32 takes 80"),
        (binary(scan_tensor(packed(b"x"), "BYTES", shape=(1,)), packed(b"x")), 400,
         "instances[0]: "),
    ],
}
CASES = [(model, i) for model, cases in BAD.items() for i in range(len(cases))]


@pytest.mark.parametrize("model, index", CASES, ids=[f"{m}-{i}" for m, i in CASES])
def test_bad_binary_request_answered_alone(handlers_, photos, model, index):
    handler, context = handlers_[model]
    bad, status, words = BAD[model][index]
    tensor, values = model_input(model, photos, count=1)
    tensor.set_data_from_numpy(values)
    answers = run(handler, context, [client_request(tensor, binary_output=True), bad,
                                     client_request(tensor, binary_output=False)])
    refused = answers[1]
    assert refused.status == status, refused.raw
    assert words in refused.json["error"], refused.json
    assert HEADER not in refused.headers and refused.content_type == "application/json"
    assert [a.status for a in answers] == [200, status, 200], [a.raw[:200] for a in answers]
    result_of(answers[0]), result_of(answers[2])


def test_sizes_are_checked_before_anything_is_allocated(handlers_):
    """A header declaring 10^12 floats with 4 bytes behind it: refused at once, nothing allocated."""
    handler, context = handlers_["tiny_tensor"]
    four = b"\x00" * 4
    began = time.perf_counter()
    (answer,) = run(handler, context, [binary(scan_tensor(four, shape=(1, 10**6, 10**6)), four)])
    assert time.perf_counter() - began < 1.0
    assert answer.status == 400 and "4 bytes, shape [1, 1000000, 1000000] of FP32 takes 4000000000000" in answer.json["error"]
