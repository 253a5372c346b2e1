"""The e2e servers that tests share: one real TorchServe per configuration, for all of tests/e2e.

- `server`: the repo's config.properties, serving every request/response model of the catalogue
  (the list comes from catalogue.yaml: a new model is tested too);
- `step_lm_server`: the same, plus the generating model switched to the step mode
  (continuousBatching, batchSize 4): gRPC, generation and the async mode's reference answers;
- `async_lm_server`: the generating model as built (the async worker mode), batchSize 1: the async
  mode, the OpenAI routes and gRPC's streams.

A test that needs other settings, a fresh server or one it may break starts its own. Package
scope: the servers live while tests/e2e runs and are stopped before tests/unit starts. Started
through serving.launcher (the same launcher the benchmarks and the tuner use): temp working
directory, free loopback ports, token auth on, always stopped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from build.catalogue import Catalogue
from serving.launcher import TorchServe
from serving.repo import CATALOGUE
from serving.ts_config import ModelSettings, ServerConfig
from tests.e2e.helpers import store_with

# The request/response models, which the repository's config.properties serves together; generating
# models answer step by step on their own servers (tests/e2e/test_generation.py).
MODELS = Catalogue.load(CATALOGUE).names_of(generating=False)
LM = Catalogue.load(CATALOGUE).names_of(generating=True)[0]


@pytest.fixture(scope="session")
def root_config(repo_root: Path) -> ServerConfig:
    return ServerConfig.load(repo_root / "config.properties")


@pytest.fixture(scope="package")
def server(model_store: Path, root_config: ServerConfig):
    with TorchServe(model_store, base_config=root_config.path, wait_for=MODELS) as ts:
        yield ts


@pytest.fixture(scope="package")
def step_lm_server(model_store: Path, tmp_path_factory):
    store = store_with(model_store, tmp_path_factory.mktemp("step-store"), LM, {"causal_lm": {"mode": "step"}})
    with TorchServe(store, models={LM: ModelSettings(batch_size=4, max_batch_delay_ms=1)}, load=(*MODELS, LM)) as ts:
        yield ts


@pytest.fixture(scope="package")
def async_lm_server(model_store: Path):
    with TorchServe(model_store, models={LM: ModelSettings(batch_size=1, max_batch_delay_ms=1)}, load=(LM,)) as ts:
        yield ts
