"""NVIDIA's tritonclient (HTTP) against a real TorchServe: Open Inference Protocol v2 as that client
speaks it, with the binary tensor extension for inputs and outputs, and in plain JSON.

minilm takes BYTES (one sentence per instance) and answers an FP32 [n, 384] tensor; digits takes FP32
scans [n, 1, 8, 8] and answers one BYTES element per scan (its /predictions JSON). Every form gives
the answers /predictions gives for the same inputs. A malformed binary request is a 400 naming the
field and the worker lives. TorchServe 0.12 routes no `/v2/health/*` and no `GET /v2/models/<m>`:
the client's liveness, readiness and metadata calls fail, and the documented way around them
(docs/api.md) answers.
"""

from __future__ import annotations

import json
import struct
from urllib.parse import urlsplit

import numpy as np
import pytest
import requests
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import assert_same_answer

pytestmark = pytest.mark.e2e
TEXT_MODEL, TENSOR_MODEL = "minilm", "digits"
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome."]
SCANS = ("example_2.npy", "example_6.npy", "example_7.npy")
# (binary inputs, binary outputs); None: no outputs named, so the client asks for all of them as binary.
FORMS = [(True, True), (True, False), (False, True), (False, False), (True, None)]


@pytest.fixture(scope="module")
def client(server):
    with triton.InferenceServerClient(urlsplit(server.inference_url).netloc, connection_timeout=60,
                                      network_timeout=120) as c:
        yield c


def auth(server) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.tokens.inference}"}


def infer(client, server, model: str, tensor: triton.InferInput, binary_output) -> np.ndarray:
    outputs = None if binary_output is None else [triton.InferRequestedOutput("output-0", binary_data=binary_output)]
    result = client.infer(model, [tensor], outputs=outputs, request_id=f"{model}-tc", headers=auth(server))
    response = result.get_response()
    assert "outputs" in response, f"not an Open Inference Protocol answer: {str(response)[:200]}"
    assert response["id"] == f"{model}-tc"
    sent_binary = "binary_data_size" in (result.get_output("output-0").get("parameters") or {})
    assert sent_binary == (binary_output is not False), result.get_output("output-0")
    return result.as_numpy("output-0")


def predictions(server, model: str, body: bytes, content_type: str) -> dict:
    resp = server.predict(model, body, content_type)
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.mark.parametrize("binary_input, binary_output", FORMS)
def test_minilm_bytes_in_fp32_out(server, client, binary_input, binary_output):
    alone = [predictions(server, TEXT_MODEL, json.dumps({"text": s}).encode(), "application/json") for s in SENTENCES]
    tensor = triton.InferInput("text", [len(SENTENCES)], "BYTES")
    tensor.set_data_from_numpy(np.array([s.encode() for s in SENTENCES], dtype=np.object_), binary_data=binary_input)
    embeddings = infer(client, server, TEXT_MODEL, tensor, binary_output)
    assert embeddings.dtype == np.float32 and embeddings.shape == (len(SENTENCES), 384)
    for row, want in zip(embeddings, alone):
        assert_same_answer(TEXT_MODEL, {"embedding": row.tolist()}, want, f"tritonclient {binary_input, binary_output}")


@pytest.mark.parametrize("binary_input, binary_output", FORMS)
def test_digits_fp32_in_classes_out(server, client, repo_root, binary_input, binary_output):
    scans = [np.load(repo_root / "models" / TENSOR_MODEL / name).astype(np.float32) for name in SCANS]
    alone = [predictions(server, TENSOR_MODEL, json.dumps({"inputs": s.tolist()}).encode(), "application/json")
             for s in scans]
    batch = np.stack(scans)
    tensor = triton.InferInput("scan", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch, binary_data=binary_input)
    classes = infer(client, server, TENSOR_MODEL, tensor, binary_output)
    assert classes.shape == (len(scans),)
    for element, want in zip(classes, alone):
        text = element.decode() if isinstance(element, bytes) else element
        assert_same_answer(TENSOR_MODEL, json.loads(text), want, f"tritonclient {binary_input, binary_output}")


def test_malformed_binary_request_is_a_400_naming_the_field(server):
    """Shape [2] with one element's bytes: refused by name, the worker lives and answers the next one."""
    pids = server.worker_pids(TEXT_MODEL)
    element = b"A man is eating food."
    data = struct.pack("<I", len(element)) + element
    header = json.dumps({"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(data)}}]}).encode()
    resp = requests.post(f"{server.inference_url}/v2/models/{TEXT_MODEL}/infer", data=header + data, timeout=60,
                         headers={**auth(server), "Inference-Header-Content-Length": str(len(header)),
                                  "Content-Type": "application/octet-stream"})
    assert resp.status_code == 400, resp.text
    assert "the shape declares 2 elements, the binary data holds 1" in resp.json()["error"]
    assert server.worker_pids(TEXT_MODEL) == pids
    predictions(server, TEXT_MODEL, json.dumps({"text": "still here"}).encode(), "application/json")


def test_health_and_metadata_are_not_routed_and_the_way_around(server, client):
    """TorchServe 0.12 has no /v2/health/* and no GET /v2/models/<m>: 404s, which tritonclient reads as
    not live / not ready, and a metadata error. /ping and the management API's describe answer."""
    assert client.is_server_live(headers=auth(server)) is False
    assert client.is_server_ready(headers=auth(server)) is False
    assert client.is_model_ready(TEXT_MODEL, headers=auth(server)) is False
    with pytest.raises(InferenceServerException) as failed:
        client.get_model_metadata(TEXT_MODEL, headers=auth(server))
    assert failed.value.status() == "404"
    assert server.client.ping().json()["status"] == "Healthy"
    description = server.describe(TEXT_MODEL)
    assert description["modelName"] == TEXT_MODEL and description["workers"][0]["status"] == "READY"
