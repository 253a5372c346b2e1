"""The server the hostile-client suite attacks: one real TorchServe for the whole package.

Every request/response model of the catalogue at batchSize 8 with a 50 ms batch delay (a probe and
its batch-mates, released together, share one batch), the text embedder a second time with the
response cache on (`<name>_cached`: the cache's path through the batch is a contract of its own),
and the generating model as built (the async worker mode, OpenAI's routes). Started through
serving.launcher (free loopback ports, temp dir, token auth) and always stopped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench.archive_settings import with_cache
from serving.launcher import TorchServe
from serving.ts_config import ModelSettings
from tests.e2e.conftest import LM, MODELS
from tests.e2e.helpers import settings_of
from tests.e2e.hostile.contract import Sender
from tests.e2e.hostile.mates import Alone

BATCHED = ModelSettings(batch_size=8, max_batch_delay_ms=50)
EMBEDDER = next(m for m in MODELS if settings_of(m).family == "text_embedder")
CACHED = f"{EMBEDDER}_cached"


@pytest.fixture(scope="package")
def hostile_server(model_store: Path, tmp_path_factory):
    store = tmp_path_factory.mktemp("hostile-store")
    with_cache(model_store / f"{EMBEDDER}.mar", store, CACHED, max_mib=4)
    for archive in model_store.glob("*.mar"):
        (store / archive.name).symlink_to(archive.resolve())
    models = {**{m: BATCHED for m in MODELS}, CACHED: BATCHED, LM: ModelSettings(batch_size=1, max_batch_delay_ms=1)}
    with TorchServe(store, models=models, load=tuple(models), archives={CACHED: f"{CACHED}.mar"}) as ts:
        yield ts


@pytest.fixture(scope="package")
def sender(hostile_server):
    client = Sender(hostile_server)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="package")
def alone(sender) -> Alone:
    return Alone(sender)
