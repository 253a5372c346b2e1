"""Every request/response family on Ray Serve (serving/ray/), one cluster for the module: each model's
examples answered as its archive answers in-process through TorchServe's adapter; a bad request's own
4xx beside its batch-mates' 200s; KServe v1 and the whole Open Inference Protocol v2 through NVIDIA's
tritonclient (health, readiness, metadata, inference with binary tensors); TorchServe's key check and
size limit; deadlines; the handler's metrics in Ray's Prometheus export; the reliability kit's replica killed
under load and an overload refused at once past job_queue_size; a stop that leaves no process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import numpy as np
import psutil
import pytest
import requests
import tritonclient.http as triton
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.load import loadgen, stats
from benchmarks.load.traffic import Traffic, capacity, fixed_windows, payloads, target
from benchmarks.reliability import faults
from handlers.deadlines import START_HEADER, TIMEOUT_HEADER
from serving.ray.launcher import RayServe
from serving.repo import REPO_ROOT
from serving.ts_config import ModelSettings
from tests.e2e.conftest import MODELS
from tests.e2e.helpers import answered, assert_bad_request, assert_same_answer, bad_cases, examples_of, inprocess_answers
from tests.e2e.ray_cluster import running

pytestmark = pytest.mark.e2e

TENSOR_MODEL, TEXT_MODEL = "digits", "minilm"
BATCH = ModelSettings(batch_size=4, max_batch_delay_ms=300)  # digits: room for four requests in one batch
LIMIT = 4 * 1024 * 1024  # max_request_size of this cluster
QUEUE = 16  # its job_queue_size (the overload's, as TorchServe's overload test has it)
OVERLOAD_P99_S = 2.0  # latency bound at 3x minilm's capacity (queue 16: p99 ~0.3 s here; 8 s when refusals were slow)
METRICS_WAIT_S = 40.0  # Ray's agent exports every few seconds
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome."]


@pytest.fixture(scope="module")
def ray_serve(model_store):
    yield from running(RayServe(model_store, models=MODELS, settings={TENSOR_MODEL: BATCH}, max_request_size=LIMIT,
                                job_queue_size=QUEUE))


def auth(cluster) -> dict[str, str]:
    return {"Authorization": f"Bearer {cluster.tokens.inference}"}


def digits_body(name: str = "example_9.json") -> bytes:
    return (REPO_ROOT / "models" / TENSOR_MODEL / name).read_bytes()


@pytest.mark.parametrize("model", MODELS)
def test_each_family_answers_as_its_archive_does_on_torchserves_adapter(ray_serve, model, tmp_path):
    examples = examples_of(model)
    served = [answered(ray_serve.predict(model, r.body, r.content_type), model, e) for e, r in examples]
    alone = inprocess_answers(model, [r for _, r in examples], tmp_path)
    for (example, _), one, other in zip(examples, served, alone):
        assert_same_answer(model, one, other, example.name)
    for case in bad_cases(model, 1):  # refused by the handler with its 400, the replica still answers
        assert_bad_request(ray_serve.predict(model, case.body, case.content_type))
    answered(ray_serve.predict(model, examples[0][1].body, examples[0][1].content_type), model, examples[0][0])


def test_a_bad_request_gets_its_own_4xx_while_its_batch_mates_get_200(ray_serve):
    bodies = [digits_body(), b'{"inputs": "not a tensor"}', digits_body(), digits_body()]
    with ThreadPoolExecutor(len(bodies)) as pool:  # inside one batch window (300 ms, 4 at most)
        replies = list(pool.map(lambda b: ray_serve.predict(TENSOR_MODEL, b, "application/json"), bodies))
    assert [r.status_code // 100 for r in replies] == [2, 4, 2, 2], [(r.status_code, r.text[:200]) for r in replies]
    assert replies[0].json() == replies[2].json() == replies[3].json()


def test_tritonclient_end_to_end(ray_serve):
    """The client's health, readiness and metadata calls (TorchServe 0.12 routes none of them) and
    inference with binary tensors in and out: the answers /predictions gives."""
    headers = auth(ray_serve)
    with triton.InferenceServerClient(urlsplit(ray_serve.inference_url).netloc, network_timeout=120) as client:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(TEXT_MODEL, headers=headers)
        assert not client.is_model_ready("no-such-model", headers=headers)
        metadata = client.get_model_metadata(TEXT_MODEL, headers=headers)
        assert metadata["name"] == TEXT_MODEL and metadata["outputs"][0]["datatype"] == "FP32", metadata
        assert client.get_server_metadata()["extensions"]
        tensor = triton.InferInput("text", [len(SENTENCES)], "BYTES")
        tensor.set_data_from_numpy(np.array([s.encode() for s in SENTENCES], dtype=np.object_), binary_data=True)
        result = client.infer(TEXT_MODEL, [tensor], request_id="ray-tc", headers=headers,
                              outputs=[triton.InferRequestedOutput("output-0", binary_data=True)])
    assert result.get_response()["id"] == "ray-tc"
    assert "binary_data_size" in (result.get_output("output-0").get("parameters") or {})
    embeddings = result.as_numpy("output-0")
    assert embeddings.dtype == np.float32 and embeddings.shape == (len(SENTENCES), 384)
    for row, sentence in zip(embeddings, SENTENCES):
        alone = answered(ray_serve.predict(TEXT_MODEL, {"text": sentence}), TEXT_MODEL)
        assert_same_answer(TEXT_MODEL, {"embedding": row.tolist()}, alone, sentence)


def test_kserve_v1_answers_as_predictions(ray_serve):
    scan = json.loads(digits_body())["inputs"]
    alone = answered(ray_serve.predict(TENSOR_MODEL, digits_body(), "application/json"), TENSOR_MODEL)
    v1 = requests.post(f"{ray_serve.inference_url}/v1/models/{TENSOR_MODEL}:predict",
                       json={"instances": [{"inputs": scan}]}, headers=auth(ray_serve), timeout=60)
    assert v1.status_code == 200, v1.text
    assert_same_answer(TENSOR_MODEL, v1.json()["predictions"][0], alone, "KServe v1")
    bad = requests.post(f"{ray_serve.inference_url}/v1/models/{TENSOR_MODEL}:predict", json={"instances": "x"},
                        headers=auth(ray_serve), timeout=60)
    assert bad.status_code == 400 and bad.json()["error"], bad.text
    unknown = requests.post(f"{ray_serve.inference_url}/v1/models/nope:predict", json={"instances": [scan]},
                            headers=auth(ray_serve), timeout=60)
    assert unknown.status_code == 404 and unknown.json()["type"] == "ModelNotFoundException", unknown.text


def test_the_inference_key_is_checked_as_torchserve_does(ray_serve):
    url = ray_serve.inference_url
    for token in ("", "wrong"):
        reply = ray_serve.predict(TENSOR_MODEL, digits_body(), "application/json", token=token)
        assert reply.status_code == 400 and reply.json()["type"] == "InvalidKeyException", reply.text
        v2 = requests.get(f"{url}/v2/models/{TENSOR_MODEL}", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert v2.status_code == 400 and v2.json()["type"] == "InvalidKeyException", v2.text
    assert requests.get(f"{url}/v2/health/live", timeout=30).status_code == 200  # probes need no key


def test_a_body_over_max_request_size_is_413(ray_serve):
    body = b"\0" * (LIMIT + 1)
    reply = ray_serve.predict(TENSOR_MODEL, body, "application/octet-stream")
    assert reply.status_code == 413, (reply.status_code, reply.text[:200])
    v2 = requests.post(f"{ray_serve.inference_url}/v2/models/{TENSOR_MODEL}/infer", data=body, timeout=60,
                       headers={**auth(ray_serve), "Content-Type": "application/json"})
    assert v2.status_code == 413, (v2.status_code, v2.text[:200])
    answered(ray_serve.predict(TENSOR_MODEL, digits_body(), "application/json"), TENSOR_MODEL)


def test_openai_embeddings_under_predictions_as_on_torchserve(ray_serve):
    url = f"{ray_serve.inference_url}/predictions/{TEXT_MODEL}/1.0/v1/embeddings"
    reply = requests.post(url, json={"input": SENTENCES[:2], "model": TEXT_MODEL}, headers=auth(ray_serve), timeout=60)
    assert reply.status_code == 200, reply.text
    data = reply.json()["data"]
    alone = answered(ray_serve.predict(TEXT_MODEL, {"text": SENTENCES[0]}), TEXT_MODEL)
    assert len(data) == 2 and reply.json()["usage"]["prompt_tokens"] > 0
    assert_same_answer(TEXT_MODEL, {"embedding": data[0]["embedding"]}, alone, "OpenAI embeddings")


def test_deadlines_as_on_torchserve(ray_serve):
    """A request out of time while it waited for its batch (300 ms) gets the handler's 504 and its
    batch-mates 200; a malformed deadline header a 400 naming it (tests/e2e/test_deadlines.py on TorchServe)."""
    sent_ms = str(int(time.time() * 1000))
    headers = [{}, {TIMEOUT_HEADER: "1", START_HEADER: sent_ms}, {}, {TIMEOUT_HEADER: "60000", START_HEADER: sent_ms},
               {TIMEOUT_HEADER: "soon"}]
    with ThreadPoolExecutor(len(headers)) as pool:
        replies = list(pool.map(lambda h: ray_serve.predict(TENSOR_MODEL, digits_body(), "application/json", headers=h),
                                headers))
    assert [r.status_code for r in replies] == [200, 504, 200, 200, 400], [r.text[:200] for r in replies]
    assert replies[1].json()["type"] == "DeadlineExceeded" and TIMEOUT_HEADER in replies[4].json()["message"]


def test_the_handlers_metrics_reach_rays_prometheus_export(ray_serve):
    """The handler's counters, recorded in each replica, read at the head's metrics export port (Ray's
    agent exports them every few seconds): batches and items per model, beside Serve's own series."""
    for _ in range(3):
        answered(ray_serve.predict(TENSOR_MODEL, digits_body(), "application/json"), TENSOR_MODEL)
    answered(ray_serve.predict(TEXT_MODEL, {"text": SENTENCES[0]}), TEXT_MODEL)
    # Each replica exports on its own schedule: wait until every expected series has come, not the first.
    def expected(seen: dict) -> list[str]:
        return [what for what, ok in (
            ("3 digits items", seen.get(("ray_handler_items_total", TENSOR_MODEL), 0) >= 3),
            ("a digits batch", seen.get(("ray_handler_batches_total", TENSOR_MODEL), 0) >= 1),
            ("minilm inference ms", seen.get(("ray_handler_inference_ms_total", TEXT_MODEL), 0) > 0)) if not ok]

    deadline, seen = time.monotonic() + METRICS_WAIT_S, {}
    while time.monotonic() < deadline:
        seen = {(s.name, s.labels.get("ModelName")): s.value
                for family in text_string_to_metric_families(ray_serve.client.metrics_text()) for s in family.samples
                if s.name.startswith("ray_handler_")}
        if not expected(seen):
            break
        time.sleep(2.0)
    assert not expected(seen), f"missing after {METRICS_WAIT_S:.0f} s: {expected(seen)}; seen {sorted(seen)}"


def test_replicas_listen_on_their_clusters_own_ports(ray_serve):
    """HAProxy sends to each replica's own HTTP port: taken from this cluster's block (the launcher's),
    not from the range every cluster on the host would share (30000-31000)."""
    for model in (TENSOR_MODEL, TEXT_MODEL):
        (pid,) = ray_serve.worker_pids(model)
        proc = psutil.Process(pid)
        low = int(proc.environ()["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"])
        listening = {c.laddr.port for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        assert listening & set(range(low, low + 100)), (low, sorted(listening))
        assert not listening & set(range(30000, 31001)), sorted(listening)


DRIVER = "import sys, ray; ray.init(address=sys.argv[1], logging_level='error'); print(len(ray.nodes()))"


def test_a_driver_needs_the_clusters_token(ray_serve):
    """Ray's gRPC servers listen beyond loopback: a driver without the cluster's token is refused, so a
    port within reach is not a way to run code; with it (the launcher's drivers), it joins."""
    env = ray_serve.driver_env()
    gcs = f"127.0.0.1:{ray_serve.head.ports['port']}"
    joined = subprocess.run([sys.executable, "-c", DRIVER, gcs], env=env, capture_output=True, text=True,
                            timeout=120, cwd=REPO_ROOT)
    assert joined.returncode == 0 and joined.stdout.strip().splitlines()[-1] == "1", joined.stderr[-2000:]
    stranger = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
    refused = subprocess.run([sys.executable, "-c", DRIVER, gcs], env=stranger, capture_output=True, text=True,
                             timeout=120, cwd=REPO_ROOT)
    assert refused.returncode != 0 and "auth" in refused.stderr.lower(), (refused.stdout, refused.stderr[-2000:])


def test_a_replica_killed_under_load_loses_no_request(ray_serve):
    """The reliability kit's kill (benchmarks/reliability/faults.py), as on TorchServe: digits' replica
    SIGKILLed under four clients; every request gets an HTTP answer within the cluster's request
    timeout (the models' responseTimeout: a request Serve strands during the replacement gets Serve's
    408 then, not silence), Serve's controller starts a new replica, and every request sent once it
    is ready succeeds. After the metrics test: the replica it kills held the counters that test reads."""
    result = faults.kill_worker_under_load(ray_serve, TENSOR_MODEL, concurrency=4, after_s=4.0,
                                           timeout_s=BATCH.response_timeout_s + 15.0)
    print(result.summary())
    assert result.passed, result.summary() + "".join(f"\n  FAIL {p}" for p in result.problems)
    assert result.traffic.sent > 0 and result.recovery_s is not None


def test_overload_is_refused_with_503_at_once_and_nothing_is_lost(ray_serve):
    """Three times minilm's capacity, open loop: past job_queue_size waiting besides a batch, Serve's
    replica limits answer 503 at once, as TorchServe's full queue does (Serve alone would queue without
    bound; a door in the app's own code refused, but only behind the saturated replica, so 96 clients
    backed up and the accepted requests' p99 reached seconds); every request gets an answer, the
    accepted ones within a bound, the replica lives, and afterwards requests succeed. minilm, not
    digits: a replica refuses on its own event loop, so an overload of a model as cheap as digits
    (three times ~1,000 req/s) goes past what that loop can refuse, and the refusals queue; the
    overload benchmark measures where (docs/ray.md#what-differs-from-torchserve). Last in the module:
    a replica killed right after it lost requests once (same section)."""
    pids = ray_serve.worker_pids(TEXT_MODEL)
    rps = capacity(ray_serve, TEXT_MODEL, seconds=6.0, concurrency=8)
    run = loadgen.open_loop(target(ray_serve, TEXT_MODEL, timeout_s=60.0), payloads(TEXT_MODEL), 3 * rps,
                            fixed_windows(3), 3.0, connections=96, progress=lambda line: None)
    traffic = Traffic.of(run.samples)
    accepted = stats.summarize(s.latency for s in run.samples if s.ok)
    refused = stats.summarize(s.latency for s in run.samples if s.status == 503)
    print(traffic.describe(), f"capacity {rps:.0f} req/s; accepted: {accepted}; refused: {refused}")
    assert traffic.lost == 0 and traffic.ok > 0, traffic.describe()
    assert set(traffic.errors) == {"503"}, traffic.describe()
    assert accepted.p99_ms < OVERLOAD_P99_S * 1000 and refused.p99_ms < OVERLOAD_P99_S * 1000, (accepted, refused)
    after = ray_serve.predict(TEXT_MODEL, {"text": SENTENCES[0]})
    assert after.status_code == 200, after.text
    assert ray_serve.worker_pids(TEXT_MODEL) == pids
