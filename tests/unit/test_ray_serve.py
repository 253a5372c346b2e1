"""serving/ray/ without a cluster: the Serve config a launcher writes, the archive a replica unpacks,
the key check at its door, the Ray engine adapter running a batch (handlers/engines/ray.py), the
`ray start` lines of its nodes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import yaml

from serving.errors import ConfigError, StartupError
from serving.ray import nodes, routes_config, serve_config
from serving.ray.archive import Archive
from serving.ray.routes_door import authorised, url_path
from serving.repo import REPO_ROOT
from serving.ts_config import ModelSettings


def make_mar(store: Path, name: str, frontend: dict | None = None) -> Path:
    mar = store / f"{name}.mar"
    config = {**(frontend or {}), "handler": {"family": "tensor"}}
    with zipfile.ZipFile(mar, "w") as archive:
        archive.writestr("model-config.yaml", yaml.safe_dump(config))
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": name, "modelVersion": "2.0"}}))
    return mar


def test_settings_come_from_the_archive_unless_the_caller_gives_them(tmp_path):
    make_mar(tmp_path, "a", {"batchSize": 8, "maxBatchDelay": 5, "minWorkers": 2, "responseTimeout": 30})
    make_mar(tmp_path, "b")
    plans = serve_config.plans(tmp_path, ("a", "b"), {"b": ModelSettings(batch_size=4, max_batch_delay_ms=2, threads=2,
                                                                      response_timeout_s=20)})
    config = serve_config.serve_config(plans, 8123, tmp_path / "archives", tmp_path / "key_file.json")
    a, b = config["applications"]
    # Serve has one request timeout for the cluster: the longest any model's responseTimeout allows
    assert config["http_options"] == {"host": "127.0.0.1", "port": 8123, "request_timeout_s": 30.0}
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


def test_an_archive_unpacks_with_its_manifest_and_config(tmp_path):
    archive = Archive.unpack(make_mar(tmp_path, "a"), tmp_path / "a")
    assert archive.version == "2.0" and archive.model_dir == tmp_path / "a"
    assert archive.model_config["handler"] == {"family": "tensor"}


def test_an_archive_without_the_modules_ray_needs_is_refused_with_the_fix(tmp_path):
    archive = Archive.unpack(make_mar(tmp_path, "a"), tmp_path / "a")
    with pytest.raises(StartupError, match="lacks what Ray needs .*rebuild the archive"):
        archive.import_package("no_such_package_in_this_archive")


def test_url_path_and_the_inference_key():
    assert url_path("/predictions/m", "/predictions/m") == ""
    assert url_path("/predictions/m/1.0/v1/embeddings", "/predictions/m") == "v1/embeddings"
    assert url_path("/predictions/m/v1/models", "/predictions/m") == "v1/models"
    assert url_path("/2.0/v1/embeddings", "/predictions/m") == "v1/embeddings"  # the prefix already taken off
    assert authorised("Bearer k1", "k1") and authorised("bearer k1", "k1") and authorised("anything", "")
    assert not authorised("Bearer k2", "k1") and not authorised("", "k1") and not authorised("k1", "k1")


def test_the_ingress_app_takes_the_root_and_every_model_app_the_size_limit():
    app = routes_config.application(["a", "b"], "/k/key_file.json", routes_config.DoorLimits(1234, 9))
    assert (app["route_prefix"], app["import_path"]) == ("/", "serving.ray.routes:build")
    assert app["args"] == {"models": ["a", "b"], "key_file": "/k/key_file.json", "max_request_size": 1234,
                           "job_queue_size": 9}
    assert app["deployments"][0]["ray_actor_options"] == {"num_cpus": 0}  # takes none of the plan's CPUs


ADAPTER = textwrap.dedent('''
    import json, sys
    from pathlib import Path

    class Missing:
        """A meta path hook: neither TorchServe nor Ray can be imported."""
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("ts", "ray"):
                raise ImportError(f"not installed here ({name})")
            return None

    sys.meta_path.insert(0, Missing())
    import yaml
    from handlers.engines import Worker
    from handlers.engines.ray import Ray, RayContext, open_http
    from handlers.handler import Handler

    class Sink:
        calls = []
        def time(self, name, ms, dims): self.calls.append(name)
        def count(self, name, value, dims, unit=None): self.calls.append(name)
        def gauge(self, name, value, unit, dims): self.calls.append(name)

    class Headers:
        """starlette's Headers as the adapter sees them: items() with names as sent."""
        def __init__(self, pairs): self.pairs = pairs
        def items(self): return list(self.pairs)

    model_dir = Path(sys.argv[1])
    config = yaml.safe_load((model_dir / "model-config.yaml").read_text())
    config["handler"].setdefault("runtime", {})["warmup"] = False
    context = RayContext(Worker("tiny_tensor", model_dir, max_batch_size=4, model_config=config), Sink())
    handler = Handler(engine=Ray)
    handler.initialize(context)
    good = json.dumps({"inputs": [[[0.0] * 4] * 4]}).encode()
    kserve = json.dumps({"inputs": [{"name": "x", "shape": [1, 1, 4, 4], "datatype": "FP32", "data": [0.0] * 16}]}).encode()
    as_json = Headers([("Content-Type", "application/json")])
    records = [open_http(as_json, good, "plain", "", "r0", 0), open_http(as_json, b'{"inputs": "no"}', "plain", "", "r1", 0),
               open_http(as_json, kserve, "kserve", "", "r2", 0), open_http(as_json, good, "plain", "/v1/models/", "r3", 0)]
    replies = handler.handle(records, context)
    assert not any(name.split(".")[0] in ("ts", "ray") for name in sys.modules)
    print(json.dumps({"routes": [r.route for r in records], "statuses": [r.status for r in replies],
                      "first": json.loads(replies[0].body), "kserve": json.loads(replies[2].body),
                      "metrics": sorted(set(Sink.calls))}))
''')


def test_the_ray_adapter_runs_the_batch_loop_without_ray_or_torchserve(tiny_dirs):
    """Records built at a replica's door (route from the URL), one batch through the handler's loop on
    the Ray adapter: a bad request's own 400 beside 200s, a KServe v2 answer, OpenAI's models list."""
    done = subprocess.run([sys.executable, "-c", ADAPTER, str(tiny_dirs["tiny_tensor"])], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["routes"] == ["plain", "plain", "kserve", "openai"]
    assert result["statuses"] == [200, 400, 200, 200], result
    assert result["first"] and result["kserve"]["outputs"][0]["name"] == "output-0"
    assert "HandlerBatches" in result["metrics"]


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


def test_ray_metrics_get_snake_case_names_as_rays_exporter_shows_them():
    """Ray's exporter lowercases a name (HandlerBatches would read ray_handlerbatches_total): the sink
    gives Ray snake case, one metric per name, the dimensions' names as its tag keys."""
    from handlers.engines.ray import RayMetrics

    made = []

    class Metric:
        def __init__(self, name, description, tag_keys):
            self.name, self.tag_keys, self.values = name, tag_keys, []
            made.append(self)

        def inc(self, value, tags):
            self.values.append((value, tags))

        set = inc

    sink = RayMetrics(type("RayServeMetrics", (), {"Counter": Metric, "Gauge": Metric}))
    dims = (("ModelName", "digits"), ("Level", "Model"))
    sink.count("HandlerBatches", 1, dims)
    sink.count("HandlerBatches", 2, dims)
    sink.time("HandlerPreprocessMs", 1.5, dims)
    sink.gauge("GPUMemoryPeakMiB", 10.0, "MB", dims)
    assert [m.name for m in made] == ["handler_batches", "handler_preprocess_ms", "gpu_memory_peak_mib"]
    assert made[0].tag_keys == ("ModelName", "Level")
    assert made[0].values == [(1, dict(dims)), (2, dict(dims))]


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b'{"a": ' * 5000 + b"1" + b"}" * 5000,
                                  b"\xff not UTF-8", b"{not JSON"])
def test_a_json_body_that_does_not_decode_reaches_the_family_as_bytes_as_on_torchserve(body):
    """TorchServe's worker forwards the bytes of a JSON body its parser fails on (nested past Python's
    limit included): so does the Ray door, for the family to refuse it by name, never a 500."""
    from handlers.engines.ray import decode_body

    assert decode_body(body, "application/json") is body
    assert decode_body(b'{"a": [1]}', "application/json") == {"a": [1]}


def test_a_refusal_for_a_full_queue_names_it_as_torchserve_does():
    from serving.ray.routes_door import queue_full

    reply = queue_full("digits", 16)
    doc = json.loads(reply.body)
    assert (reply.status_code, reply.media_type, doc["code"], doc["type"]) == (
        503, "application/json", 503, "ServiceUnavailableException")
    assert "job_queue_size" in doc["message"] and "16" in doc["message"]


def test_each_cluster_gives_its_replicas_ports_of_its_own():
    """Serve's replicas would take their direct-ingress ports from one range per host: a port a dead
    replica freed could go to another cluster's replica, and this cluster's HAProxy would send its
    requests there. Each cluster's blocks are free when picked, and two clusters' differ."""
    import random

    one, two = nodes.replica_port_env(random.Random(1)), nodes.replica_port_env(random.Random(2))
    spans = []
    for env in (one, two):
        for kind in ("HTTP", "GRPC"):
            low = int(env[f"RAY_SERVE_DIRECT_INGRESS_MIN_{kind}_PORT"])
            high = int(env[f"RAY_SERVE_DIRECT_INGRESS_MAX_{kind}_PORT"])
            assert high - low + 1 == nodes.REPLICA_PORT_BLOCK and 20000 <= low and high < nodes.SPARE_PORT_SPAN[0]
            spans.append(set(range(low, high + 1)))
    assert all(not a & b for i, a in enumerate(spans) for b in spans[i + 1:])


def test_the_ports_a_cluster_binds_late_are_free_and_clear_of_rays_own_and_the_ephemeral_range():
    """HAProxy's ports and Serve's HTTP port are bound after every Ray process started: picked from a
    span where neither Ray's workers (10002-19999) nor the kernel's port-0 binds (32768-) land, free on
    every interface, and never one the caller already holds."""
    import random
    import socket

    first = nodes.spare_ports(2, rng=random.Random(3))
    again = nodes.spare_ports(3, avoid=first, rng=random.Random(3))
    assert len(set(first)) == 2 and not set(first) & set(again)
    assert all(nodes.SPARE_PORT_SPAN[0] <= p < nodes.SPARE_PORT_SPAN[1] <= 32768 for p in first + again)
    with socket.socket() as sock:  # a port bound on loopback only is not free "everywhere"
        sock.bind(("127.0.0.1", first[0]))
        assert first[0] not in nodes.spare_ports(50, rng=random.Random(3))  # the same draw: first[0] comes first


def test_the_ingress_answers_a_model_whose_replicas_are_full_with_torchserves_503():
    """Serve's router refuses a handle call past the model's replica limits (BackPressureError): the
    ingress answers it as TorchServe's full queue does, never a 500."""
    import asyncio

    from ray.serve.exceptions import BackPressureError
    from starlette.requests import Request as HttpRequest

    from serving.ray.routes import Ingress

    class Full:
        async def remote(self, *args):
            raise BackPressureError(num_queued_requests=1, max_queued_requests=1)

    ingress = Ingress.func_or_class(["digits"], job_queue_size=16)
    ingress._handles["digits"] = type("Handle", (), {"infer": Full()})()
    body = b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}'

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v2/models/digits/infer", "headers": [], "query_string": b""}
    reply = asyncio.run(Ingress.func_or_class.__call__(ingress, HttpRequest(scope, receive)))
    doc = json.loads(reply.body)
    assert (reply.status_code, doc["type"]) == (503, "ServiceUnavailableException"), reply.body
    assert "16" in doc["message"]


INGRESS_IMPORTS = textwrap.dedent("""
    import sys
    from serving.ray.worker_setup import setup
    setup()  # what Ray runs in each worker before its actor
    import serving.ray.routes
    from ray.serve._private import utils
    from ray._private.arrow_serialization import _register_custom_datasets_serializers
    _register_custom_datasets_serializers(None)  # Ray's serialiser: returns at once when pyarrow is absent
    loaded = sorted(m for m in ("torch", "pandas", "pyarrow") if sys.modules.get(m) is not None)
    assert loaded == [] and utils.pd is None, (loaded, utils.pd)
""")


def test_the_ingress_replica_loads_no_torch_and_serve_no_pandas_or_pyarrow():
    """The ingress app's replica holds no model: it imports no torch; and with the workers' setup hook
    Serve's and Ray's optional imports of pandas and pyarrow find them absent."""
    done = subprocess.run([sys.executable, "-c", INGRESS_IMPORTS], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_batch_runs_on_the_replicas_event_loop_as_torchserves_worker_runs_it_on_its_one_thread():
    """The handler's batch loop runs on the replica's event loop: on a thread of its own, the loop and
    the forward pass would trade the GIL (docs/ray.md#one-thread-per-replica)."""
    import asyncio
    import threading

    from serving.ray.app import ArchiveDeployment

    ran_on = []

    class Handler:
        def handle(self, batch, context):
            ran_on.append(threading.get_ident())
            return [f"reply-{record}" for record in batch]

    replica = object.__new__(ArchiveDeployment.func_or_class)
    replica.handler, replica.context = Handler(), None

    handle_batch = ArchiveDeployment.func_or_class.handle_batch.__wrapped__  # the body under @serve.batch

    async def one_batch():
        return await handle_batch(replica, ["a", "b"]), threading.get_ident()

    replies, loop_thread = asyncio.run(one_batch())
    assert replies == ["reply-a", "reply-b"]
    assert ran_on == [loop_thread]
