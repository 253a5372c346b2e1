"""TorchServe 0.12's gRPC inference API (serving/grpc_client.py) against REST on one real server.

Every family's catalogue examples answer the same bytes over gRPC as over REST, each sent in the
form its family reads without a Content-Type (serving/grpc_forms.py); a request the handler refuses
gets the gRPC status TorchServe maps its HTTP status to, with the handler's message; a missing or
wrong key is refused; a streamed generation (StreamPredictions) is the REST stream, message for
line. And what gRPC does not carry, each shown: the Content-Type, every other header, a 404.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import grpc
import pytest

from benchmarks.reliability.corpus import HANDLER, family_cases
from build.catalogue import Catalogue
from handlers.families import family_class
from serving.grpc_client import GrpcClient, handler_message
from serving.grpc_forms import grpc_body
from serving.launcher import TorchServe
from serving.repo import CATALOGUE, REPO_ROOT
from serving.ts_config import ModelSettings
from tests.e2e.conftest import MODELS
from tests.e2e.helpers import examples_of, settings_of

pytestmark = pytest.mark.e2e

LM, EMBEDDER, TENSOR = "tinylm", "minilm", "digits"
SERVED = (*MODELS, LM)
# The frontend's class line under a handler's message in the status details (GRPCJob.sendError).
FRONTEND_LINE = "\norg.pytorch.serve.http.InternalServerException"
STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 413: grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.fixture(scope="module")
def ts(model_store):
    """One server for the module: the request/response models as config.properties tunes them, and
    the causal LM as its archive is built (step mode: continuousBatching), batched as test_generation has it."""
    with TorchServe(model_store, models={LM: ModelSettings(batch_size=4, max_batch_delay_ms=1)}, load=SERVED) as server:
        yield server


@pytest.fixture(scope="module")
def client(ts):
    with GrpcClient(ts.grpc_target, ts.tokens.inference, timeout_s=120) as grpc_client:
        yield grpc_client


def family_of(model: str) -> str:
    return Catalogue.load(CATALOGUE).entry(model).family


def rest_bytes(ts, model: str, body: bytes, content_type: str) -> bytes:
    """REST's answer, read whole (a streamed one: every chunk, as it came)."""
    with ts.predict(model, body, content_type, stream=True) as resp:
        raw = b"".join(resp.iter_content(chunk_size=None))
        assert resp.status_code == 200, raw[:300]
    return raw


def streams(model: str, body: bytes) -> bool:
    return family_class(family_of(model)).generates and bool(json.loads(body).get("stream"))


def test_ping_answers_healthy_with_the_key(client):
    assert client.ping() == {"status": "Healthy"}


@pytest.mark.parametrize("model", SERVED)
def test_every_example_answers_the_same_bytes_over_grpc_as_over_rest(ts, client, model):
    examples = examples_of(model)
    assert examples, f"{model} has no catalogue examples"
    for example, request in examples:
        body = grpc_body(family_of(model), request.body, request.content_type)
        expected = rest_bytes(ts, model, request.body, request.content_type)
        if streams(model, body):
            got = b"".join(client.stream_predict(model, body))
        else:
            got = client.predict(model, body)
        assert got == expected, f"{model} {example.name}: gRPC {got[:120]!r} != REST {expected[:120]!r}"
    first = grpc_body(family_of(model), examples[0][1].body, examples[0][1].content_type)
    if not streams(model, first):  # the version named: the archive's
        version = Catalogue.load(CATALOGUE).entry(model).version
        assert client.predict(model, first, version) == rest_bytes(ts, model, examples[0][1].body, examples[0][1].content_type)


def refused_cases(model: str, per_status: int = 2):
    """Requests the model's handler refuses with 400 or 413, in the form it reads without a Content-Type."""
    settings = settings_of(model)
    default = family_class(settings.family).request_content_type
    chosen: dict[int, list] = {}
    for case in family_cases(settings.family, settings.family_settings):
        if case.valid or case.layer != HANDLER or case.status not in STATUS or case.form_encoded:
            continue
        if case.content_type is None or case.content_type.split(";")[0] != default:
            continue
        if len(chosen.setdefault(case.status, [])) < per_status:
            chosen[case.status].append(case)
    return [case for cases in chosen.values() for case in cases]


@pytest.mark.parametrize("model", SERVED)
def test_a_refused_request_gets_its_grpc_status_with_the_handlers_message(ts, client, model):
    cases = refused_cases(model)
    assert cases, f"no refused cases for {model}"
    for case in cases:
        rest = ts.predict(model, case.body, case.content_type)
        assert rest.status_code == case.status, (case.name, rest.status_code, rest.text[:200])
        with pytest.raises(grpc.RpcError) as err:
            client.predict(model, case.body)
        assert err.value.code() == STATUS[case.status], (case.name, err.value.code(), err.value.details())
        # Exactly what comes through: the handler's message, then the frontend's class line.
        assert err.value.details() == rest.json()["message"] + FRONTEND_LINE, case.name
        assert handler_message(err.value) == rest.json()["message"]
    example = examples_of(model)[0][1]
    body = grpc_body(family_of(model), example.body, example.content_type)
    if not streams(model, body):
        assert client.predict(model, body)  # the worker answers on


@pytest.mark.parametrize("token", ["", "wrong", "management"])
def test_a_missing_or_wrong_key_is_refused(ts, client, token):
    key = ts.tokens.management if token == "management" else token
    for call in (lambda: client.ping(token=key), lambda: client.predict(EMBEDDER, "A man is eating food.", token=key)):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "Token Authorization failed" in err.value.details()
    assert client.predict(EMBEDDER, "A man is eating food.")


@pytest.mark.parametrize("extra", [{}, {"temperature": 0.8, "top_k": 50, "seed": 5}])
def test_a_streamed_generation_is_the_rest_stream_message_for_line(ts, client, extra):
    body = json.dumps({"prompt": "The for statement is used to", "max_new_tokens": 40, "stream": True, **extra}).encode()
    rest = rest_bytes(ts, LM, body, "application/json")
    lines = [line for line in rest.split(b"\n") if line.strip()]
    messages = list(client.stream_predict(LM, body))
    assert len(messages) > 1 and len(messages) == len(lines)
    assert b"".join(messages) == rest
    assert [json.loads(m) for m in messages] == [json.loads(line) for line in lines]
    assert json.loads(messages[-1])["finish_reason"] in ("stop", "length")


def test_grpc_carries_no_content_type(ts, client):
    """The handler gets the body with an empty content type: JSON to a text model is read as text,
    an .npy file to a tensor model as JSON."""
    as_json = json.dumps({"text": "A man is eating food."}).encode()
    over_grpc = client.predict(EMBEDDER, as_json)
    assert over_grpc == rest_bytes(ts, EMBEDDER, as_json, "text/plain")  # the JSON text itself, embedded
    assert over_grpc != rest_bytes(ts, EMBEDDER, as_json, "application/json")
    npy = next(r for e, r in examples_of(TENSOR) if r.content_type == "application/x-npy")
    with pytest.raises(grpc.RpcError) as err:
        client.predict(TENSOR, npy.body)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed JSON" in err.value.details()
    with pytest.raises(ValueError, match="no gRPC form"):
        grpc_body(family_of(EMBEDDER), as_json, "application/x-www-form-urlencoded")


def test_grpc_metadata_never_reaches_the_handler(ts, client):
    """X-Priority is a header the causal LM reads: REST refuses a bad one, gRPC's metadata is dropped."""
    body = {"prompt": "The import statement", "max_new_tokens": 6}
    rest = ts.predict(LM, body, headers={"X-Priority": "urgent"})
    assert rest.status_code == 400 and "X-Priority" in rest.json()["message"]
    answer = json.loads(client.predict(LM, body, headers={"X-Priority": "urgent"}))
    assert answer["generated_tokens"] > 0


def test_an_unknown_model_is_internal_over_grpc_where_rest_says_404(ts, client):
    assert ts.predict("no_such_model", b"x", "text/plain").status_code == 404
    with pytest.raises(grpc.RpcError) as err:
        client.predict("no_such_model", b"x")
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert handler_message(err.value) == "Model not found: no_such_model"


def test_the_one_liner_make_serve_prints_answers_as_rest_does(ts):
    from serving.serve_wait import grpc_line

    line = grpc_line(list(SERVED), ts.grpc_target, ts.workdir / "key_file.json", python=sys.executable)
    assert line is not None and f"predict({EMBEDDER!r}" in line, line
    proc = subprocess.run(shlex.split(line), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    example = examples_of(EMBEDDER)[0][1]
    assert proc.stdout.rstrip("\n") == rest_bytes(ts, EMBEDDER, example.body, example.content_type).decode("utf-8")
