"""The servers the hostile-client suite attacks, one engine after the other: a real TorchServe, then
a real Ray Serve cluster (serving/ray/) on the same archives, each once for the whole package.

Every request/response model of the catalogue at batchSize 8 with a 50 ms batch delay (a probe and
its batch-mates, released together, share one batch), the text embedder a second time with the
response cache on (`<name>_cached`: the cache's path through the batch is a contract of its own),
and the generating model as built (the async worker mode, OpenAI's routes). Started through
serving.launcher or serving.ray.launcher (free loopback ports, temp dir, token auth) and always
stopped. Ray's metrics reach its export every second here, so the batching witnesses need not wait
its default ten. A test of a route only one engine serves (TorchServe's gRPC, Ray's OpenAI at a plain
/v1) is marked only_on(<engine>).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench.archive_settings import with_cache
from serving.launcher import TorchServe
from serving.ray.launcher import RayServe
from serving.ts_config import ModelSettings
from tests.e2e.conftest import LM, MODELS
from tests.e2e.helpers import settings_of
from tests.e2e.hostile.contract import Sender
from tests.e2e.hostile.mates import Alone
from tests.e2e.hostile.served import OnRay, OnTorchServe, Served
from tests.e2e.ray_cluster import running

BATCHED = ModelSettings(batch_size=8, max_batch_delay_ms=50)
# Ray Serve: a request reaches the replica's batcher through the ingress (HAProxy, and the KServe app
# for v1/v2), which on two cores spreads a group released together past 50 ms.
RAY_BATCHED = ModelSettings(batch_size=8, max_batch_delay_ms=200)
EMBEDDER = next(m for m in MODELS if settings_of(m).family == "text_embedder")
CACHED = f"{EMBEDDER}_cached"


ENGINES = ("torchserve", "ray")
RAY_ENV = {"RAY_metrics_report_interval_ms": "1000"}


def pytest_collection_modifyitems(config, items) -> None:
    """A test marked only_on(<engines>) runs on those engines alone."""
    kept, dropped = [], []
    for item in items:
        spec, only = getattr(item, "callspec", None), item.get_closest_marker("only_on")
        engine = spec.params.get("hostile_server") if spec is not None else None
        (dropped if engine is not None and only is not None and engine not in only.args else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="package", params=ENGINES)
def hostile_server(request, model_store: Path, tmp_path_factory) -> Served:
    store = tmp_path_factory.mktemp("hostile-store")
    with_cache(model_store / f"{EMBEDDER}.mar", store, CACHED, max_mib=4)
    for archive in model_store.glob("*.mar"):
        (store / archive.name).symlink_to(archive.resolve())
    models = {**{m: BATCHED for m in MODELS}, CACHED: BATCHED, LM: ModelSettings(batch_size=1, max_batch_delay_ms=1)}
    if request.param == "ray":
        models = {m: RAY_BATCHED if s is BATCHED else s for m, s in models.items()}
        for cluster in running(RayServe(store, models=tuple(models), settings=models, env=RAY_ENV)):
            yield OnRay(cluster)
        return
    with TorchServe(store, models=models, load=tuple(models), archives={CACHED: f"{CACHED}.mar"}) as ts:
        yield OnTorchServe(ts)


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
