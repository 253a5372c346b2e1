"""TorchServe 0.12's gRPC inference API (serving/grpc_client.py) against REST, on real servers.

One server with every model as built (tinylm in step mode), one with tinylm in the asynchronous
mode. Every family's catalogue examples answer the same bytes over gRPC as over REST, each sent in
the form its family reads without a Content-Type (serving/grpc_forms.py); a request the handler
refuses arrives as an OK call carrying the handler's error body (the client raises HandlerRefused);
a missing or wrong key is refused; a streamed generation in async mode is the REST stream, a line
per message. And what gRPC cannot do, each shown: carry the Content-Type or any other header, say
404, generate in step mode. StreamPredictions of an answer sent in one piece is that answer, one
message, and costs no worker.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from benchmarks.reliability.corpus import HANDLER, family_cases
from build.catalogue import Catalogue
from serving.grpc_client import GrpcClient, HandlerRefused, error_message
from serving.grpc_forms import grpc_body
from serving.repo import CATALOGUE, REPO_ROOT
from tests.e2e.conftest import MODELS
from tests.e2e.helpers import examples_of, settings_of

pytestmark = pytest.mark.e2e

LM, EMBEDDER, TENSOR = "tinylm", "minilm", "digits"
SERVED = (*MODELS, LM)
STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 413: grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.fixture(scope="module")
def ts(step_lm_server):
    """Every model as its archive is built but tinylm, switched to the step mode (continuousBatching,
    batched as test_generation has it); the request/response models as config.properties tunes them
    (tests/e2e/conftest.py's shared server)."""
    return step_lm_server


@pytest.fixture(scope="module")
def client(ts):
    with GrpcClient(ts.grpc_target, ts.tokens.inference, timeout_s=120) as grpc_client:
        yield grpc_client


@pytest.fixture(scope="module")
def async_ts(async_lm_server):
    """tinylm in the asynchronous worker mode (asyncCommunication), the mode gRPC can stream from."""
    return async_lm_server


@pytest.fixture(scope="module")
def async_client(async_ts):
    with GrpcClient(async_ts.grpc_target, async_ts.tokens.inference, timeout_s=120) as grpc_client:
        yield grpc_client


def family_of(model: str) -> str:
    return Catalogue.load(CATALOGUE).entry(model).family


def rest_bytes(ts, model: str, body: bytes, content_type: str) -> bytes:
    """REST's answer, read whole (a streamed one: every chunk, as it came)."""
    with ts.predict(model, body, content_type, stream=True) as resp:
        raw = b"".join(resp.iter_content(chunk_size=None))
        assert resp.status_code == 200, raw[:300]
    return raw


def streams(body: bytes) -> bool:
    return bool(json.loads(body).get("stream"))


def read_stream(raw: bytes) -> tuple[str, dict]:
    """An NDJSON generation stream: its text, and its last line without the text. How tokens fall
    into lines follows the engine loop's timing (a slow reader gets several per line), so two
    streams of one generation are compared by these, not byte for byte."""
    lines = [json.loads(line) for line in raw.split(b"\n") if line.strip()]
    return "".join(line["text"] for line in lines), {k: v for k, v in lines[-1].items() if k != "text"}


def collected(messages, into: list) -> None:
    """Iterate a stream into `into`, so that what came before an error stays readable."""
    for message in messages:
        into.append(message)


def test_ping_answers_healthy_with_the_key(client):
    assert client.ping() == {"status": "Healthy"}


@pytest.mark.parametrize("model", MODELS)
def test_every_example_answers_the_same_bytes_over_grpc_as_over_rest(ts, client, model):
    examples = examples_of(model)
    assert examples, f"{model} has no catalogue examples"
    for example, request in examples:
        got = client.predict(model, grpc_body(family_of(model), request.body, request.content_type))
        expected = rest_bytes(ts, model, request.body, request.content_type)
        assert got == expected, f"{model} {example.name}: gRPC {got[:120]!r} != REST {expected[:120]!r}"
    first = examples[0][1]
    version = Catalogue.load(CATALOGUE).entry(model).version  # named: the archive's
    assert client.predict(model, grpc_body(family_of(model), first.body, first.content_type), version) \
        == rest_bytes(ts, model, first.body, first.content_type)


def test_the_causal_lms_examples_answer_the_same_bytes_in_async_mode(async_ts, async_client):
    """Whole answers by Predictions, streamed ones by StreamPredictions (their messages joined)."""
    for example, request in examples_of(LM):
        body = grpc_body(family_of(LM), request.body, request.content_type)
        expected = rest_bytes(async_ts, LM, request.body, request.content_type)
        if streams(body):
            assert read_stream(b"".join(async_client.stream_predict(LM, body))) == read_stream(expected), example.name
        else:
            assert async_client.predict(LM, body) == expected, example.name


def refused_cases(model: str, per_status: int = 2):
    """Requests the model's handler refuses with 400 or 413, in the form it reads without a Content-Type."""
    settings = settings_of(model)
    chosen: dict[int, list] = {}
    for case in family_cases(settings.family, settings.family_settings):
        if case.valid or case.layer != HANDLER or case.status not in STATUS or case.form_encoded or not case.content_type:
            continue
        try:
            if grpc_body(settings.family, case.body, case.content_type) != case.body:
                continue  # only bodies that go over gRPC as they are: the same bytes refused both ways
        except ValueError:
            continue
        if len(chosen.setdefault(case.status, [])) < per_status:
            chosen[case.status].append(case)
    return [case for cases in chosen.values() for case in cases]


@pytest.mark.parametrize("model", SERVED)
def test_a_refused_request_arrives_as_an_ok_call_carrying_the_handlers_error(ts, client, model):
    """TorchServe 0.12's GRPCJob.response drops a handler's per-request status: the call ends OK and
    its message is the handler's error body, with REST's status and type. The client raises
    HandlerRefused from it."""
    cases = refused_cases(model)
    assert cases, f"no refused cases for {model}"
    for case in cases:
        rest = ts.predict(model, case.body, case.content_type)
        assert rest.status_code == case.status, (case.name, rest.status_code, rest.text[:200])
        raw = client.predict(model, case.body, raw=True)
        with pytest.raises(HandlerRefused) as refused:
            client.predict(model, case.body)
        assert (refused.value.status, refused.value.kind) == (case.status, rest.json()["type"]), case.name
        # The wording may differ: REST's worker hands the handler a text/* body as str and a JSON one
        # parsed, gRPC's always the bytes.
        assert refused.value.code == STATUS[case.status] and refused.value.body == raw and refused.value.message
    example = examples_of(model)[0][1]
    if model != LM:
        assert client.predict(model, grpc_body(family_of(model), example.body, example.content_type))  # answers on


@pytest.mark.parametrize("token", ["", "wrong", "management"])
def test_a_missing_or_wrong_key_is_refused(ts, client, token):
    key = ts.tokens.management if token == "management" else token
    for call in (lambda: client.ping(token=key), lambda: client.predict(EMBEDDER, "A man is eating food.", token=key)):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "Token Authorization failed" in err.value.details()
    assert client.predict(EMBEDDER, "A man is eating food.")


PROMPT = "The for statement is used to"


@pytest.mark.parametrize("extra", [{}, {"temperature": 0.8, "top_k": 50, "seed": 5}])
def test_a_streamed_generation_is_the_rest_stream_a_line_per_message_in_async_mode(async_ts, async_client, extra):
    body = json.dumps({"prompt": PROMPT, "max_new_tokens": 40, "stream": True, **extra}).encode()
    rest = rest_bytes(async_ts, LM, body, "application/json")
    messages = list(async_client.stream_predict(LM, body))
    assert len(messages) > 1 and all(m.endswith(b"\n") and m.count(b"\n") == 1 for m in messages)  # a line each
    text, last = read_stream(b"".join(messages))
    assert (text, last) == read_stream(rest) and text.strip()
    assert last["finish_reason"] in ("stop", "length")


def test_step_mode_answers_predictions_with_its_first_step_only(ts, client):
    """The archive as built (continuousBatching): GRPCJob completes a Predictions call on the first
    response the worker sends, one step's: empty for a whole answer, the first line for a stream."""
    body = {"prompt": PROMPT, "max_new_tokens": 20}
    assert json.loads(rest_bytes(ts, LM, json.dumps(body).encode(), "application/json"))["generated_tokens"] == 20
    assert client.predict(LM, body) == b""
    streamed = rest_bytes(ts, LM, json.dumps({**body, "stream": True}).encode(), "application/json")
    assert client.predict(LM, {**body, "stream": True}) == streamed.split(b"\n")[0] + b"\n"


def test_step_mode_stalls_streampredictions_after_its_first_message(ts, client):
    """ContinuousBatching drops a job after a chunk when job.isOpen() is false, and GRPCJob.isOpen()
    returns isCancelled(): a live gRPC call reads as a closed one. The worker hears no more of the
    request, so the stream ends only at the deadline."""
    body = {"prompt": PROMPT, "max_new_tokens": 20, "stream": True}
    lines = rest_bytes(ts, LM, json.dumps(body).encode(), "application/json").split(b"\n")
    got: list[bytes] = []
    with pytest.raises(grpc.RpcError) as err:
        collected(client.stream_predict(LM, body, timeout_s=5), got)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert got == [lines[0] + b"\n"] and len(lines) > 3


def test_grpc_carries_no_content_type(ts, client):
    """The handler gets the body with an empty content type: JSON to a text model is read as text,
    an .npy file to a tensor model as JSON."""
    as_json = json.dumps({"text": "A man is eating food."}).encode()
    over_grpc = client.predict(EMBEDDER, as_json)
    assert over_grpc == rest_bytes(ts, EMBEDDER, as_json, "text/plain")  # the JSON text itself, embedded
    assert over_grpc != rest_bytes(ts, EMBEDDER, as_json, "application/json")
    npy = next(r for e, r in examples_of(TENSOR) if r.content_type == "application/x-npy")
    with pytest.raises(HandlerRefused) as refused:
        client.predict(TENSOR, npy.body)
    assert refused.value.status == 400 and "malformed JSON" in refused.value.message
    with pytest.raises(ValueError, match="no gRPC form"):
        grpc_body(family_of(EMBEDDER), as_json, "application/x-www-form-urlencoded")


def test_grpc_metadata_never_reaches_the_handler(async_ts, async_client):
    """X-Priority is a header the causal LM reads: REST refuses a bad one, gRPC's metadata is dropped."""
    body = {"prompt": "The import statement", "max_new_tokens": 6}
    rest = async_ts.predict(LM, body, headers={"X-Priority": "urgent"})
    assert rest.status_code == 400 and "X-Priority" in rest.json()["message"]
    answer = json.loads(async_client.predict(LM, body, headers={"X-Priority": "urgent"}))
    assert answer["generated_tokens"] == 6


def test_an_unknown_model_is_internal_over_grpc_where_rest_says_404(ts, client):
    assert ts.predict("no_such_model", b"x", "text/plain").status_code == 404
    with pytest.raises(grpc.RpcError) as err:
        client.predict("no_such_model", b"x")
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert error_message(err.value) == "Model not found: no_such_model"


def test_the_one_liner_make_serve_prints_answers_as_rest_does(ts):
    from serving.serve_wait import grpc_line

    line = grpc_line(list(SERVED), ts.grpc_target, ts.workdir / "key_file.json", python=sys.executable)
    assert line is not None and EMBEDDER in line, line
    proc = subprocess.run(shlex.split(line), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    example = examples_of(EMBEDDER)[0][1]
    assert proc.stdout.rstrip("\n") == rest_bytes(ts, EMBEDDER, example.body, example.content_type).decode("utf-8")


def test_streampredictions_of_a_single_answer_is_that_answer_and_costs_no_worker(ts, client):
    """TorchServe 0.12's GRPCJob reads `ts_stream_next` on every answer to StreamPredictions and
    threw inside the frontend's worker thread when it was absent (any model that answers once): the
    worker died and its REST batch-mates got 500. Every gRPC answer is now marked as its request's
    last (handlers/engines/torchserve.py TorchServe.close): one message, the REST answer (to the served
    precision), the same worker."""
    text = "A man is eating food."
    before = ts.client.worker_pids(EMBEDDER)
    expected = rest_bytes(ts, EMBEDDER, text.encode(), "text/plain")
    with ThreadPoolExecutor(4) as pool:  # REST batch-mates sent beside it
        mates = [pool.submit(ts.predict, EMBEDDER, f"{text} {i}".encode(), "text/plain") for i in range(3)]
        messages = list(client.stream_predict(EMBEDDER, text, timeout_s=30))
        assert all(mate.result().status_code == 200 for mate in mates)
    assert len(messages) == 1
    # Batched beside its mates it is padded to their length. The AOTInductor package's bf16 kernels
    # round differently at another batch shape: the same embedding to bf16's precision, not float's.
    got, want = json.loads(messages[0]), json.loads(expected)
    assert got.keys() == want.keys()
    got_v, want_v = np.asarray(got["embedding"]), np.asarray(want["embedding"])
    assert np.allclose(got_v, want_v, atol=2e-3, rtol=0)
    assert got_v @ want_v / (np.linalg.norm(got_v) * np.linalg.norm(want_v)) > 0.9999
    assert ts.client.worker_pids(EMBEDDER) == before
