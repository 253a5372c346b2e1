"""Ray Serve's config file as the tuner writes it (portable, read back, made local) and the KubeRay
RayService made from it, validated offline against KubeRay's vendored CRD and Serve's own schema."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import yaml

from deployment.errors import DeployError, ValidationFailed
from deployment.kuberay import rayservice
from serving.errors import ConfigError
from serving.ray import routes_config, serve_config
from serving.ray.worker_setup import SETUP_HOOK
from serving.ts_config import ModelSettings


def make_mar(store: Path, name: str) -> Path:
    mar = store / f"{name}.mar"
    with zipfile.ZipFile(mar, "w") as archive:
        archive.writestr("model-config.yaml", yaml.safe_dump({"batchSize": 2, "handler": {"family": "tensor"}}))
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": name, "modelVersion": "1.0"}}))
    return mar


@pytest.fixture
def tuned(tmp_path: Path) -> Path:
    """A tuned file for two models: a (2 replicas of 2 CPUs, batch 8, 5 ms) and b (the archive's values)."""
    store = tmp_path / "model_store"
    store.mkdir()
    for name in ("a", "b"):
        make_mar(store, name)
    plans = serve_config.plans(store, ("a", "b"), {"a": ModelSettings(batch_size=8, max_batch_delay_ms=5,
                                                                      min_workers=2, max_workers=2, threads=2)})
    return serve_config.write(tmp_path / "ray-serve.yaml", serve_config.portable(plans))


def test_the_tuned_file_carries_the_plan_in_user_config_and_reads_back(tuned: Path) -> None:
    config = yaml.safe_load(tuned.read_text())
    a = config["applications"][0]
    (deployment,) = a["deployments"]
    assert deployment["user_config"] == {"max_batch_size": 8, "batch_wait_timeout_s": 0.005}
    assert (deployment["num_replicas"], deployment["ray_actor_options"]) == (2, {"num_cpus": 2})
    assert a["args"]["archive"] == "model_store/a.mar" and a["args"]["key_file"] == ""
    a_plan, b_plan = serve_config.read(tuned, tuned.parent / "model_store")
    assert a_plan.settings == ModelSettings(batch_size=8, max_batch_delay_ms=5, min_workers=2, max_workers=2, threads=2)
    assert config["http_options"]["request_timeout_s"] == 120.0  # TorchServe's default responseTimeout
    assert (b_plan.settings.batch_size, b_plan.settings.threads) == (2, 1)
    assert a_plan.archive == (tuned.parent / "model_store" / "a.mar").resolve()


def test_user_config_wins_over_the_args_and_a_missing_archive_is_named(tuned: Path, tmp_path: Path) -> None:
    config = yaml.safe_load(tuned.read_text())
    config["applications"][0]["deployments"][0]["user_config"]["max_batch_size"] = 16
    serve_config.write(tuned, config)
    assert serve_config.read(tuned, tmp_path / "model_store")[0].settings.batch_size == 16
    with pytest.raises(ConfigError, match="a.mar, b.mar, missing in"):
        serve_config.read(tuned, tmp_path)


def test_localise_points_the_file_at_this_hosts_archives_port_and_keys(tuned: Path, tmp_path: Path) -> None:
    local = serve_config.localise(yaml.safe_load(tuned.read_text()), tmp_path / "model_store", 8123,
                                  tmp_path / "unpacked", tmp_path / "key_file.json")
    args = local["applications"][0]["args"]
    assert local["http_options"] == {"host": "127.0.0.1", "port": 8123, "request_timeout_s": 120.0}
    assert args["archive"] == str((tmp_path / "model_store" / "a.mar").resolve())
    assert (args["unpack_root"], args["key_file"]) == (str(tmp_path / "unpacked"), str(tmp_path / "key_file.json"))


def test_the_rayservice_is_sized_by_the_plan_and_validates(tuned: Path, tmp_path: Path) -> None:
    size, files = rayservice.write(tuned, tmp_path / "kuberay", worker_memory_mib=3072)
    assert (size.worker_pods, size.cpus_per_pod) == (3, 2)  # a: 2 replicas, b: 1; the largest replica: 2 CPUs
    doc = yaml.safe_load(files[0].read_text())
    workers = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert (workers["replicas"], workers["rayStartParams"]) == (3, {"num-cpus": "2"})
    assert workers["template"]["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "2", "memory": "3072Mi"}
    served = yaml.safe_load(doc["spec"]["serveConfigV2"])
    assert served["applications"][0]["args"]["archive"] == f"{rayservice.MODEL_STORE}/a.mar"
    assert served["applications"][0]["deployments"][0]["user_config"]["max_batch_size"] == 8
    assert "rayservice.yaml: valid" in rayservice.validate(doc)
    assert "COPY --chown=ray model_store/a.mar" in files[2].read_text()


def test_the_rayservice_serves_the_ingress_routes_as_make_serve_does(tuned: Path, tmp_path: Path) -> None:
    """KServe v1 / OIP v2 / OpenAI at /v1 on the cluster too: the ingress app beside the model apps, every
    app with the size limit (every model app with the job queue too, and room for twice what its door
    holds), the ingress on no worker pod of its own; once even if the file has one."""
    size, files = rayservice.write(tuned, tmp_path / "kuberay", limits=routes_config.DoorLimits(1234, 7))
    doc = yaml.safe_load(files[0].read_text())
    served = yaml.safe_load(doc["spec"]["serveConfigV2"])
    assert [app["name"] for app in served["applications"]] == ["a", "b", routes_config.INGRESS_APP]
    ingress = served["applications"][-1]
    assert (ingress["route_prefix"], ingress["import_path"]) == ("/", routes_config.IMPORT_PATH)
    assert ingress["args"] == {"models": ["a", "b"], "key_file": f"{rayservice.KEY_DIR}/key_file.json",
                               "max_request_size": 1234, "job_queue_size": 7}
    assert {app["args"]["max_request_size"] for app in served["applications"]} == {1234}
    a = served["applications"][0]["deployments"][0]
    # Ongoing: what TorchServe's queue and batch hold; Serve refuses past job_queue_size more waiting.
    assert (a["max_ongoing_requests"], a["max_queued_requests"]) == (7 + a["user_config"]["max_batch_size"], 7)
    assert size.worker_pods == 3 and "rayservice.yaml: valid" in rayservice.validate(doc)
    launched = routes_config.with_ingress(yaml.safe_load(tuned.read_text()), "/k.json",  # the launcher's file
                                          routes_config.DoorLimits(99))
    serve_config.write(tuned, launched)
    again, files = rayservice.write(tuned, tmp_path / "again")
    served = yaml.safe_load(files[1].read_text())
    assert [app["name"] for app in served["applications"]] == ["a", "b", routes_config.INGRESS_APP]
    assert again == size and "model_store/ingress" not in files[2].read_text()


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].update(replica=3), "'replica' was unexpected"),
    (lambda d: d["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": 0}),
     "0 is not of type 'string'"),
    (lambda d: d["spec"].update(serveConfigV2=d["spec"]["serveConfigV2"].replace("num_replicas", "num_replica")),
     "serveConfigV2 is not a Ray Serve config"),
])
def test_a_wrong_field_fails_validation(tuned: Path, change, message: str) -> None:
    doc = rayservice.manifest(yaml.safe_load(tuned.read_text()), rayservice.Sizing(1, 1, 1024))
    change(doc)
    with pytest.raises(ValidationFailed, match=message):
        rayservice.validate(doc)


def test_no_tuned_file_names_the_command_that_writes_it(tmp_path: Path) -> None:
    with pytest.raises(DeployError, match="make tune ENGINE=ray"):
        rayservice.write(tmp_path / "ray-serve.yaml", tmp_path / "out")


def test_the_tuner_replaces_its_models_app_and_keeps_the_others(tuned: Path, tmp_path: Path) -> None:
    from benchmarks.tune.ray_plan import write_plan

    write_plan(tuned, "b", tmp_path / "model_store" / "b.mar", ModelSettings(batch_size=4, max_batch_delay_ms=10,
                                                                              min_workers=1, max_workers=1, threads=1))
    a, b = serve_config.read(tuned, tmp_path / "model_store")
    assert (a.model, a.settings.batch_size, a.settings.min_workers) == ("a", 8, 2)  # kept as it was
    assert (b.model, b.settings.batch_size, b.settings.max_batch_delay_ms) == ("b", 4, 10)
    write_plan(tmp_path / "new.yaml", "a", tmp_path / "model_store" / "a.mar", ModelSettings())
    assert [p.model for p in serve_config.read(tmp_path / "new.yaml", tmp_path / "model_store")] == ["a"]


def test_the_door_limits_come_from_config_properties_and_a_wrong_value_is_named(tmp_path: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text("job_queue_size=16\n")
    assert serve_config.configured_limits(config) == routes_config.DoorLimits(routes_config.DEFAULT_MAX_REQUEST_SIZE, 16)
    config.write_text("max_request_size=100\njob_queue_size=0\n")
    with pytest.raises(ConfigError, match="job_queue_size = 0"):
        serve_config.configured_limits(config)
    config.write_text("job_queue_size=lots\n")
    with pytest.raises(ConfigError, match="job_queue_size=lots"):
        serve_config.configured_limits(config)


def test_the_clusters_request_timeout_reads_back_as_each_models_response_timeout(tuned: Path) -> None:
    config = yaml.safe_load(tuned.read_text())
    config["http_options"]["request_timeout_s"] = 45.0
    serve_config.write(tuned, config)
    assert {p.settings.response_timeout_s for p in serve_config.read(tuned, tuned.parent / "model_store")} == {45}


def test_every_app_runs_the_workers_setup_hook_unless_its_runtime_env_names_its_own(tuned: Path) -> None:
    config = yaml.safe_load(tuned.read_text())
    config["applications"][1]["runtime_env"] = {"env_vars": {"X": "1"}}
    config["applications"][0]["runtime_env"] = {"worker_process_setup_hook": "mine.setup"}
    out = routes_config.with_ingress(config, "/k.json", routes_config.DoorLimits())
    hooks = [app["runtime_env"]["worker_process_setup_hook"] for app in out["applications"]]
    assert hooks == ["mine.setup", SETUP_HOOK, SETUP_HOOK]
    assert out["applications"][1]["runtime_env"]["env_vars"] == {"X": "1"}


def test_the_tune_report_says_what_went_into_rays_file_and_how_serving_it_went() -> None:
    from benchmarks.tune import report

    ray = {"chosen": {"workers": 2, "threads": 1, "batch_size": 6, "max_batch_delay_ms": 1}, "written": "ray-serve.yaml",
           "verification": {"passed": True, "ready_s": 21.57, "answers": {"minilm": {"status": 200}}},
           "ingress": "HAProxy"}
    text = report.markdown({"model": "minilm", "slo_ms": 50.0, "started": "x", "verdict": "v", "command": "c", "ray": ray})
    assert ("Written into `ray-serve.yaml`: 2 replicas x 1 CPU, max_batch_size 6, batch_wait_timeout_s 0.001. "
            "Verified by serving that file behind HAProxy: minilm answered 200, ready in 21.6 s: passed.") in text
    failed = {**ray, "verification": {"passed": False, "ready_s": None, "answers": {"minilm": {"status": 503}}}}
    assert "minilm answered 503, ready in - s: FAILED." in report.markdown(
        {"model": "minilm", "slo_ms": 50.0, "started": "x", "verdict": "v", "command": "c", "ray": failed})
    assert "Written for Ray Serve" not in report.markdown({"model": "m", "slo_ms": 50.0, "started": "x", "verdict": "v", "command": "c"})
