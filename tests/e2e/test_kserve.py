"""KServe v1 and Open Inference Protocol v2 through a real TorchServe, batched with /predictions.

TorchServe routes POST /v1/models/<m>:predict and /v2/models/<m>/infer to our handler (adding the
`explain` header). A server with minilm at batchSize 4 and a long maxBatchDelay gets a
/predictions request, a v1 request of 2 instances, a v2 request of 2 and a malformed v2 request
at once: the four fill one batch, whose 5 accepted instances the handler's HandlerBatches counter
reports as one batch of size 5 (no subset of the three good requests sums to 5: they really shared
the forward pass). Each is answered in its own protocol with the embeddings /predictions gives
for the same sentences alone; the malformed one gets its 400 and the worker lives. The digits model
(tensor family) checks that its own /predictions form {"inputs": <nested list>} stays /predictions
(the frontend adds `explain` there too: handlers/kserve.py tells the routes apart by `url_path`).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests

from serving.launcher import TorchServe
from serving.ts_config import ModelSettings
from tests.e2e.helpers import assert_same_answer, batches_since, formed_batches

pytestmark = pytest.mark.e2e
MODEL = "minilm"
TENSOR_MODEL = "digits"
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome.",
             "A woman is playing the violin.", "TorchServe batches requests from many clients."]
TRIES = 3


@pytest.fixture(scope="module")
def server(model_store, root_config):
    settings = ModelSettings(batch_size=4, max_batch_delay_ms=1000, min_workers=1, max_workers=1)
    models = (MODEL, TENSOR_MODEL)
    with TorchServe(model_store, base_config=root_config.path, models={m: settings for m in models}, load=models,
                    wait_for=models) as ts:
        yield ts


def post(server: TorchServe, path: str, body: dict) -> requests.Response:
    """The JSON body as bytes with an explicit Content-Type (never form encoding), with the token."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {server.tokens.inference}"}
    return requests.post(f"{server.inference_url}{path}", data=json.dumps(body).encode(), headers=headers, timeout=60)


def v2_body(strings, shape=None, **extra) -> dict:
    return {"inputs": [{"name": "text", "shape": shape or [len(strings)], "datatype": "BYTES", "data": strings}],
            **extra}


def post_together(server: TorchServe, calls) -> list[requests.Response]:
    barrier = threading.Barrier(len(calls))

    def one(call):
        barrier.wait(timeout=30)
        return post(server, *call)

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(one, calls))


def test_v1_v2_and_predictions_share_one_batch(server):
    alone = []
    for sentence in SENTENCES:
        resp = post(server, f"/predictions/{MODEL}", {"text": sentence})
        assert resp.status_code == 200, resp.text
        alone.append(resp.json())
    pids = server.worker_pids(MODEL)
    calls = [(f"/predictions/{MODEL}", {"text": SENTENCES[0]}),
             (f"/v1/models/{MODEL}:predict", {"instances": [SENTENCES[1], {"text": SENTENCES[2]}]}),
             (f"/v2/models/{MODEL}/infer", v2_body(SENTENCES[3:5], id="e2e-v2")),
             (f"/v2/models/{MODEL}/infer", v2_body(SENTENCES[3:5], shape=[3]))]
    for _ in range(TRIES):
        before = formed_batches(server, MODEL)
        responses = post_together(server, calls)
        time.sleep(0.5)  # workers report their metrics a moment after the answers went out
        formed = batches_since(server, MODEL, before, items=5)
        if formed == {5: 1}:
            break
    else:
        pytest.fail(f"the four requests never formed one batch in {TRIES} tries (last: {formed})")
    plain, v1, v2, bad = responses

    assert plain.status_code == 200, plain.text
    assert_same_answer(MODEL, plain.json(), alone[0], "/predictions")

    assert v1.status_code == 200 and v1.headers["Content-Type"].startswith("application/json"), v1.text
    predictions = v1.json()["predictions"]
    assert len(predictions) == 2
    for got, want in zip(predictions, alone[1:3]):
        assert_same_answer(MODEL, got, want, "v1")

    assert v2.status_code == 200, v2.text
    answer = v2.json()
    assert (answer["model_name"], answer["id"]) == (MODEL, "e2e-v2")
    (output,) = answer["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("output-0", "FP32", [2, 384])
    for row, want in zip(np.asarray(output["data"]).reshape(2, 384), alone[3:5]):
        assert_same_answer(MODEL, {"embedding": row}, want, "v2")

    assert bad.status_code == 400, bad.text
    assert bad.json()["error"].startswith("inputs[0].shape: [3] declares 3 strings"), bad.json()
    assert server.worker_pids(MODEL) == pids  # the worker lived


def test_predictions_route_ignores_envelopes(server):
    """/predictions carries no `explain` header: an envelope there is just a body without "text"."""
    resp = post(server, f"/predictions/{MODEL}", {"instances": [SENTENCES[0]]})
    assert resp.status_code == 400 and '"text" field' in resp.json()["message"], resp.text
    assert "error" not in resp.json()


def test_tensor_family_predictions_form_and_v2(server, repo_root):
    """digits: {"inputs": <nested list>} at /predictions is the family's own form (answered as
    /predictions); the same scan as a v2 FP32 tensor gets the same answer as a BYTES JSON string."""
    body = json.loads((repo_root / "models/digits/example_9.json").read_text())
    plain = post(server, f"/predictions/{TENSOR_MODEL}", body)
    assert plain.status_code == 200 and list(plain.json())[0] == "9", plain.text
    tensor = {"id": "scan-9", "inputs": [{"name": "scan", "shape": [1, 1, 8, 8], "datatype": "FP32",
                                          "data": body["inputs"]}]}
    v2 = post(server, f"/v2/models/{TENSOR_MODEL}/infer", tensor)
    assert v2.status_code == 200, v2.text
    (output,) = v2.json()["outputs"]
    assert (output["datatype"], output["shape"]) == ("BYTES", [1])
    assert_same_answer(TENSOR_MODEL, json.loads(output["data"][0]), plain.json(), "v2")
