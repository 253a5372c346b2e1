"""serving/ray/ without a cluster: the Serve config a launcher writes, the TorchServe-like context a
replica hands the handler, the `ray start` lines of its nodes."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import yaml

from serving.errors import ConfigError, StartupError
from serving.ray import nodes, serve_config
from serving.ray.context import Archive, WorkerContext, authorised, decode_body, encode_answer, url_path
from serving.ts_config import ModelSettings


def make_mar(store: Path, name: str, frontend: dict | None = None) -> Path:
    mar = store / f"{name}.mar"
    config = {**(frontend or {}), "handler": {"family": "tensor"}}
    with zipfile.ZipFile(mar, "w") as archive:
        archive.writestr("model-config.yaml", yaml.safe_dump(config))
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": name, "modelVersion": "2.0"}}))
    return mar


def test_settings_come_from_the_archive_unless_the_caller_gives_them(tmp_path):
    make_mar(tmp_path, "a", {"batchSize": 8, "maxBatchDelay": 5, "minWorkers": 2})
    make_mar(tmp_path, "b")
    plans = serve_config.plans(tmp_path, ("a", "b"), {"b": ModelSettings(batch_size=4, max_batch_delay_ms=2, threads=2)})
    config = serve_config.serve_config(plans, 8123, tmp_path / "archives", tmp_path / "key_file.json")
    a, b = config["applications"]
    assert config["http_options"] == {"host": "127.0.0.1", "port": 8123}
    assert (a["route_prefix"], a["args"]["max_batch_size"], a["args"]["batch_wait_timeout_s"]) == ("/predictions/a", 8, 0.005)
    assert a["deployments"][0]["num_replicas"] == 2
    assert (b["args"]["max_batch_size"], b["args"]["batch_wait_timeout_s"]) == (4, 0.002)
    assert b["deployments"][0]["ray_actor_options"] == {"num_cpus": 2}
    # a replica must hold at least a full batch, or batches never fill
    assert min(d["max_ongoing_requests"] for app in (a, b) for d in app["deployments"]) >= 8


def test_a_missing_archive_or_settings_for_another_model_are_named(tmp_path):
    make_mar(tmp_path, "a")
    with pytest.raises(ConfigError, match="missing in .*b.mar"):
        serve_config.plans(tmp_path, ("a", "b"), {})
    with pytest.raises(ConfigError, match="settings for 'c'"):
        serve_config.plans(tmp_path, ("a",), {"c": ModelSettings()})


def test_an_unreadable_archive_is_a_startup_error(tmp_path):
    (tmp_path / "x.mar").write_bytes(b"not a zip")
    with pytest.raises(StartupError, match="not a readable model archive"):
        Archive.unpack(tmp_path / "x.mar", tmp_path / "x")


def test_the_context_carries_each_requests_headers_and_its_own_status(tmp_path):
    archive = Archive.unpack(make_mar(tmp_path, "a"), tmp_path / "a")
    assert archive.version == "2.0"
    worker = WorkerContext("a", archive, batch_size=4)
    assert worker.system_properties == {"model_dir": str(tmp_path / "a"), "gpu_id": None, "batch_size": 4}
    assert worker.model_yaml_config["handler"] == {"family": "tensor"}
    batch = worker.for_batch([{"x-a": "1"}, {"x-b": "2"}], ["id0", "id1"])
    batch.set_response_status(422, "bad", 1)
    batch.set_response_content_type(0, "application/json")
    assert batch.get_all_request_header(1) == {"x-b": "2"} and batch.request_ids == {0: "id0", 1: "id1"}
    assert (batch.get_response_status(0), batch.get_response_status(1)) == ((200, ""), (422, "bad"))
    assert batch.get_response_content_type(0) == "application/json" and batch.get_response_content_type(1) is None
    # the next batch starts clean
    assert worker.for_batch([{}], ["id2"]).statuses == {}


def test_bodies_and_answers_travel_as_torchserves_worker_passes_them():
    assert decode_body(b'{"a": 1}', "application/json") == {"a": 1}
    assert decode_body(b"{not json", "application/json") == b"{not json"
    assert decode_body(b"hi", "text/plain; charset=utf-8") == "hi"
    assert decode_body(b"\xff", "text/plain") == b"\xff"
    assert decode_body(b'{"a": 1}', "application/json; charset=utf-8") == b'{"a": 1}'  # TorchServe's exact match
    assert encode_answer(b"x") == b"x" and encode_answer("é") == "é".encode()
    assert json.loads(encode_answer({"class": 3})) == {"class": 3}


def test_url_path_and_the_inference_key():
    assert url_path("/predictions/m", "/predictions/m") == ""
    assert url_path("/predictions/m/1.0/v1/embeddings", "/predictions/m") == "v1/embeddings"
    assert url_path("/predictions/m/v1/models", "/predictions/m") == "v1/models"
    assert authorised("Bearer k1", "k1") and authorised("bearer k1", "k1")
    assert not authorised("Bearer k2", "k1") and not authorised("", "k1") and not authorised("k1", "k1")


def test_node_commands_use_their_own_loopback_ports(tmp_path):
    head = nodes.head(2, tmp_path / "session", dashboard=False)
    line = head.command(Path("/venv/bin/ray"))
    assert line[:3] == ["/venv/bin/ray", "start", "--block"] and "--head" in line
    assert "--include-dashboard=false" in line and f"--temp-dir={tmp_path / 'session'}" in line
    assert f"--port={head.ports['port']}" in line and "--node-ip-address=127.0.0.1" in line
    worker = nodes.worker(1, 2, f"127.0.0.1:{head.ports['port']}")
    wline = worker.command(Path("ray"))
    assert f"--address=127.0.0.1:{head.ports['port']}" in wline and "--head" not in wline
    assert not any(arg.startswith(("--port=", "--temp-dir=")) for arg in wline)
    assert len(set(head.ports.values())) == len(head.ports)
