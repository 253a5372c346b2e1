"""The gRPC client path without a server: stubs generated from the committed proto, the bodies each
family reads without a Content-Type, the address a config gives, the handler's message taken out of
a status's details. Against a real TorchServe: tests/e2e/test_grpc.py."""

from __future__ import annotations

import io
import json

import grpc
import numpy as np
import pytest

from serving.grpc_client import HandlerRefused, encode, error_message, grpc_code, refusal
from serving.grpc_forms import grpc_body
from serving.grpc_stubs import PROTO, SERVICES, generate, stubs_folder
from serving.ts_config import ServerConfig

pytestmark = pytest.mark.unit


def test_the_proto_is_torchserves_and_says_where_it_came_from():
    text = PROTO.read_text(encoding="utf-8")
    assert "v0.12.0" in text and "frontend/server/src/main/resources/proto/inference.proto" in text
    assert "package org.pytorch.serve.grpc.inference;" in text
    for rpc in ("Ping", "Predictions", "StreamPredictions", "StreamPredictions2"):
        assert f"rpc {rpc}(" in text


def test_stubs_are_generated_once_into_a_folder_keyed_by_the_proto(tmp_path):
    folder = generate(tmp_path)
    assert folder == stubs_folder(tmp_path) and (folder / f"{SERVICES}.py").is_file()
    assert "InferenceAPIsServiceStub" in (folder / f"{SERVICES}.py").read_text()
    stamp = (folder / f"{SERVICES}.py").stat().st_mtime_ns
    assert generate(tmp_path) == folder and (folder / f"{SERVICES}.py").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no scratch folder left behind


def test_a_request_message_carries_model_version_and_body():
    from serving.grpc_stubs import load

    messages = load().messages
    request = messages.PredictionsRequest(model_name="m", model_version="1.0", input={"data": encode({"a": 1})})
    again = messages.PredictionsRequest.FromString(request.SerializeToString())
    assert again.model_name == "m" and again.model_version == "1.0" and json.loads(again.input["data"]) == {"a": 1}


@pytest.mark.parametrize(("family", "body", "content_type", "expected"), [
    ("text_embedder", b'{"text": "caf\\u00e9"}', "application/json", "café".encode()),
    ("text_embedder", b"plain", "text/plain; charset=utf-8", b"plain"),
    ("image_classifier", b"\x89PNG...", "image/png", b"\x89PNG..."),
    ("image_classifier", b"\xff\xd8...", "image/jpeg", b"\xff\xd8..."),
    ("quantile_forecaster", b'{"history": [1]}', "application/json", b'{"history": [1]}'),
    ("causal_lm", b'{"prompt": "x"}', "application/json", b'{"prompt": "x"}'),
    ("tensor", b'{"inputs": [1]}', "application/json", b'{"inputs": [1]}'),
])
def test_each_family_gets_the_form_it_reads_without_a_content_type(family, body, content_type, expected):
    assert grpc_body(family, body, content_type) == expected


def test_an_npy_file_goes_as_json_inputs():
    out = io.BytesIO()
    np.save(out, np.arange(6, dtype=np.float32).reshape(1, 2, 3))
    assert json.loads(grpc_body("tensor", out.getvalue(), "application/x-npy")) == {"inputs": [[[0, 1, 2], [3, 4, 5]]]}


@pytest.mark.parametrize(("family", "body", "content_type"), [
    ("text_embedder", b'{"words": "x"}', "application/json"),
    ("text_embedder", b'{"text": 3}', "application/json"),
    ("causal_lm", b"prompt", "text/plain"),
    ("tensor", b"a,b", "text/csv"),
])
def test_a_body_with_no_grpc_form_is_refused(family, body, content_type):
    with pytest.raises(ValueError, match=family):
        grpc_body(family, body, content_type)


@pytest.mark.parametrize(("lines", "target"), [
    ([], "127.0.0.1:7070"),
    (["grpc_inference_port=9100"], "127.0.0.1:9100"),
    (["grpc_inference_address=0.0.0.0", "grpc_inference_port=9100"], "127.0.0.1:9100"),
    (["grpc_inference_address=::1"], "[::1]:7070"),
])
def test_the_grpc_target_of_a_config(tmp_path, lines, target):
    path = tmp_path / "config.properties"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert ServerConfig.load(path).grpc_target() == target


def test_the_shipped_config_binds_grpc_to_loopback(repo_root):
    config = ServerConfig.load(repo_root / "config.properties")
    assert config.get("grpc_inference_address") == config.get("grpc_management_address") == "127.0.0.1"
    assert config.grpc_target() == "127.0.0.1:7070"


class _Failed(grpc.RpcError):
    def __init__(self, details: str) -> None:
        self._details = details

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(("details", "message"), [
    ("body is empty\norg.pytorch.serve.http.InternalServerException", "body is empty"),
    ("Model not found: x\norg.pytorch.serve.archive.model.ModelNotFoundException", "Model not found: x"),
    ("Parameter model_name is required.\nBadRequestException.()", "Parameter model_name is required."),
    ("two lines\nof a message", "two lines\nof a message"),
    ("Token Authorization failed.", "Token Authorization failed."),
])
def test_the_handlers_message_without_the_frontends_class_line(details, message):
    assert error_message(_Failed(details)) == message


def test_the_handlers_error_body_is_raised_with_its_status():
    refused = refusal(b'{"code":413,"type":"PayloadTooLarge","message":"body is 9 bytes, over the limit of 8"}')
    assert isinstance(refused, HandlerRefused)
    assert (refused.status, refused.kind, refused.message) == (413, "PayloadTooLarge", "body is 9 bytes, over the limit of 8")
    assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("answer", [b'{"embedding":[0.1]}', b'{"code":200,"type":"x","message":"y"}',
                                    b'{"code":400,"type":"x","message":"y","more":1}', b'{"code" broken', b"\x89PNG"])
def test_an_answer_is_not_taken_for_a_refusal(answer):
    assert refusal(answer) is None


@pytest.mark.parametrize(("status", "code"), [(400, grpc.StatusCode.INVALID_ARGUMENT), (404, grpc.StatusCode.NOT_FOUND),
                                              (415, grpc.StatusCode.FAILED_PRECONDITION), (500, grpc.StatusCode.INTERNAL),
                                              (503, grpc.StatusCode.UNAVAILABLE), (200, grpc.StatusCode.OK)])
def test_torchserves_status_mapping(status, code):
    assert grpc_code(status) == code
