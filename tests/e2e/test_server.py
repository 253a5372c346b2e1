"""The server itself: health, the models and their config.properties values, scaling, auth."""

from __future__ import annotations

import re

import pytest
import requests

from benchmarks.load.runner import worker_threads
from benchmarks.load.server_metrics import REQUESTS, Scrape
from serving.ts_config import ModelEntry, ModelSettings
from tests.e2e.conftest import MODELS
from tests.e2e.helpers import answered, examples_of

pytestmark = pytest.mark.e2e


def test_ping(server):
    resp = server.client.ping()
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"status": "Healthy"}


def test_models_listed(server):
    assert sorted(server.list_models()) == sorted(MODELS)  # every catalogue model, from catalogue.yaml


@pytest.mark.parametrize("model", MODELS)
def test_describe_matches_config_properties(server, root_config, model):
    """The models= values of the repo's config.properties took effect (nothing in the .mar
    overrides them)."""
    if model not in root_config.model_names:  # a new model, not tuned yet: TorchServe's defaults
        defaults = ModelSettings(min_workers=int(root_config.get("default_workers_per_model", "1")),
                                 max_workers=int(root_config.get("default_workers_per_model", "1")))
        expected = ModelEntry(model, defaults, version=server.describe(model)["modelVersion"])
    else:
        expected = root_config.model(model)
    desc = server.describe(model)
    assert desc["modelVersion"] == expected.version
    assert desc["batchSize"] == expected.settings.batch_size
    assert desc["maxBatchDelay"] == expected.settings.max_batch_delay_ms
    assert desc["minWorkers"] == expected.settings.min_workers
    assert desc["maxWorkers"] == expected.settings.max_workers
    assert desc["responseTimeout"] == expected.settings.response_timeout_s
    ready = [w for w in desc["workers"] if w["status"] == "READY"]
    assert len(ready) == expected.settings.min_workers, desc["workers"]


def test_scale_workers_up_and_back(server, root_config):
    model = MODELS[0]
    settings = root_config.model(model).settings
    server.scale_workers(model, settings.min_workers + 1, settings.max_workers + 1)
    try:
        desc = server.describe(model)
        assert desc["minWorkers"] == settings.min_workers + 1
        pids = server.worker_pids(model)
        assert len(set(pids)) == settings.min_workers + 1, desc["workers"]
        assert all(w["status"] == "READY" for w in desc["workers"]), desc["workers"]
        example, request = examples_of(model)[0]
        answered(server.predict(model, request.body, request.content_type), model, example)
    finally:
        server.scale_workers(model, settings.min_workers, settings.max_workers)
    desc = server.describe(model)
    assert (desc["minWorkers"], desc["maxWorkers"]) == (settings.min_workers, settings.max_workers)
    assert len(server.worker_pids(model)) == settings.min_workers


# TorchServe 0.12 refuses a missing or wrong key with HTTP 400 and type InvalidKeyException
# (not 401/403); the inference and management keys are not interchangeable.
def _refused(resp: requests.Response) -> None:
    assert resp.status_code == 400, (resp.status_code, resp.text)
    assert resp.json()["type"] == "InvalidKeyException", resp.text


@pytest.mark.parametrize("token", ["", "wrong-token", "management"], ids=["none", "wrong", "management-key"])
def test_inference_refused_without_its_token(server, token):
    if token == "management":
        token = server.tokens.management
    request = examples_of(MODELS[0])[0][1]
    _refused(server.predict(MODELS[0], request.body, request.content_type, token=token))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    _refused(requests.get(f"{server.inference_url}/ping", headers=headers, timeout=10))


@pytest.mark.parametrize("token", ["", "wrong-token", "inference"], ids=["none", "wrong", "inference-key"])
def test_management_refused_without_its_token(server, root_config, token):
    if token == "inference":
        token = server.tokens.inference
    model = MODELS[0]
    _refused(server.client.management("GET", "/models", token=token))
    _refused(server.client.management("PUT", f"/models/{model}", token=token, params={"min_worker": 3}))
    assert len(server.worker_pids(model)) == root_config.model(model).settings.min_workers


def test_model_api_is_off(server):
    """Registering/unregistering needs --enable-model-api; without it the call is refused."""
    model = MODELS[0]
    resp = server.client.management("POST", "/models", params={"url": f"{model}.mar"})
    assert resp.status_code == 405, resp.text
    resp = server.client.management("DELETE", f"/models/{model}")
    assert resp.status_code == 405, resp.text
    assert model in server.list_models()


@pytest.mark.parametrize("model", MODELS)
def test_prometheus_metrics(server, model):
    request = examples_of(model)[0][1]
    assert server.predict(model, request.body, request.content_type).status_code == 200
    assert Scrape.of(server.metrics_text()).total(REQUESTS, model) >= 1


@pytest.mark.parametrize("model", MODELS)
def test_worker_threads_follow_the_written_plan(server, root_config, model):
    """config.properties' "threads" per model (the mix tuner's plan) is what every worker runs: the
    launcher passes the file with --ts-config, as `make serve` does (tests/e2e/test_plan_holds.py
    starts TorchServe the other ways)."""
    planned = root_config.model(model).settings.threads if model in root_config.model_names else None
    if planned is None:
        pytest.skip(f"{model} has no thread plan in config.properties")
    assert set(worker_threads(server, model)) == {planned}
    assert re.search(rf"{re.escape(model)} ready in .*threads={planned} \(from plan;", server.log_text("model_log.log"))
