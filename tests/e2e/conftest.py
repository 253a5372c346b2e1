"""The e2e server: one real TorchServe from the repo's config.properties for all of tests/e2e,
serving every catalogue model (the list comes from catalogue.yaml: a new model is tested too).

Package scope: the one server lives while tests/e2e runs and is stopped before tests/unit starts.

Started through serving.launcher (the same launcher the benchmarks and the tuner use): temp
working directory, free loopback ports, token auth on, always stopped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from build.catalogue import Catalogue
from serving.launcher import TorchServe
from serving.repo import CATALOGUE
from serving.ts_config import ServerConfig

# The request/response models, which the repository's config.properties serves together; generating
# models answer step by step on their own servers (tests/e2e/test_generation.py).
MODELS = Catalogue.load(CATALOGUE).names_of(generating=False)


@pytest.fixture(scope="session")
def root_config(repo_root: Path) -> ServerConfig:
    return ServerConfig.load(repo_root / "config.properties")


@pytest.fixture(scope="package")
def server(model_store: Path, root_config: ServerConfig):
    with TorchServe(model_store, base_config=root_config.path, wait_for=MODELS) as ts:
        yield ts
