"""Our KServe ServingRuntime: it validates against KServe's own CRD (vendored, strict), the
InferenceService names it and KServe's controller would pair them, and broken ones fail."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from deployment import __main__ as cli
from deployment import crd, kserve_runtime, validate
from deployment.errors import ValidationFailed
from deployment.image import INIT, torchserve_argv
from deployment.layout import KSERVE
from deployment.plan import PlanOptions
from serving.repo import REPO_ROOT
from tests.mix_config import mix_record, write_mix_config

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def deploy_dir(tmp_path_factory) -> Path:
    """deploy/ generated once from a repository stand-in (tiny 'archives', a mix record)."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "model_store").mkdir()
    for name in ("minilm", "efficientnet_lite0"):
        (repo / "model_store" / f"{name}.mar").write_bytes(b"PK")
    shutil.copy(REPO_ROOT / "log4j2.xml", repo / "log4j2.xml")
    write_mix_config(REPO_ROOT / "config.properties", repo / "config.properties", mix_record())
    out = repo / "deploy"
    cli.generate(repo, repo / "config.properties", out, PlanOptions())
    return out


@pytest.fixture()
def out(deploy_dir: Path, tmp_path: Path) -> Path:
    """A copy each test may break."""
    return Path(shutil.copytree(deploy_dir, tmp_path / "deploy", ignore=shutil.ignore_patterns("*.mar")))


def load(out: Path, name: str) -> dict:
    return yaml.safe_load((out / "kserve" / name).read_text())


def save(out: Path, name: str, doc: dict) -> None:
    (out / "kserve" / name).write_text(yaml.safe_dump(doc, sort_keys=False))


def check(out: Path) -> list[str]:
    lines: list[str] = []
    validate.check(out, progress=lines.append)
    return lines


def test_the_runtime_and_the_inference_service_validate_and_pair(out: Path) -> None:
    lines = check(out)
    assert any("servingruntime.yaml: valid (KServe's ServingRuntime CRD serving.kserve.io/v1alpha1, strict)" in ln
               for ln in lines)
    assert any("names torchserve-mix-runtime: format, protocol, argv and port agree" in ln for ln in lines)
    runtime, isvc = load(out, "servingruntime.yaml"), load(out, "inferenceservice.yaml")
    assert runtime["kind"] == "ServingRuntime" and runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"] == kserve_runtime.NAME
    assert model["modelFormat"] == {"name": "torchserve-mar"}
    assert {"name": "torchserve-mar", "autoSelect": False} in runtime["spec"]["supportedModelFormats"]
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    # The runtime holds the image and its argv: the InferenceService no longer does.
    assert not {"image", "command", "args", "env"} & set(model)
    (container,) = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container"
    assert container["command"] == list(INIT)
    assert container["args"] == list(torchserve_argv(KSERVE)) == [
        "torchserve", "--foreground", "--model-store", "/mnt/models/model-store",
        "--ts-config", "/mnt/models/config/config.properties", "--ncs"]
    assert container["ports"] == [{"name": "http1", "containerPort": 8085, "protocol": "TCP"}]
    assert {"name": "TS_CONFIG_FILE", "value": "/mnt/models/config/config.properties"} in container["env"]


def test_the_vendored_crd_is_made_strict() -> None:
    found = crd.load(*validate.RUNTIME_CRD)
    assert (found.kind, found.api_version) == ("ServingRuntime", "serving.kserve.io/v1alpha1")
    container = found.schema["properties"]["spec"]["properties"]["containers"]["items"]
    assert container["additionalProperties"] is False
    assert container["properties"]["ports"]["items"]["additionalProperties"] is False
    # Maps keep their value schemas (labels, annotations, resource quantities).
    assert found.schema["properties"]["spec"]["properties"]["annotations"]["additionalProperties"] == {"type": "string"}


@pytest.mark.parametrize("path, value, where", [
    (("spec", "containers", 0, "ports", 0), {"name": "http1", "containerPorts": 8085}, "spec.containers.0.ports.0"),
    (("spec", "containers", 0, "args"), "torchserve --foreground", "spec.containers.0.args"),
    (("spec", "supportedModelFormats", 0), {"name": "torchserve-mar", "priority": 0}, "spec.supportedModelFormats.0.priority"),
    (("spec", "multiModels"), False, "spec"),
    (("metadata", "name"), "Torchserve_Runtime", "metadata.name"),
    (("kind",), "ClusterServingRuntimes", "kind"),
])
def test_a_broken_runtime_fails_the_crd(out: Path, path, value, where) -> None:
    runtime = load(out, "servingruntime.yaml")
    node = runtime
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    save(out, "servingruntime.yaml", runtime)
    with pytest.raises(ValidationFailed, match=rf"servingruntime.yaml: at {where}.*strict"):
        check(out)


def runtime_spec(out: Path) -> tuple[dict, dict]:
    runtime = load(out, "servingruntime.yaml")
    return runtime, runtime["spec"]


@pytest.mark.parametrize("edit, match", [
    (lambda r, s: r["metadata"].update(name="other-runtime"),
     "spec.predictor.model.runtime is 'torchserve-mix-runtime', the runtime is 'other-runtime'"),
    (lambda r, s: s.update(protocolVersions=["v2"]), r"protocolVersion v1 not in the runtime's \['v2'\]"),
    (lambda r, s: s.update(protocolVersions=["v1", "v3"]), r"protocolVersions \['v3'\] are not KServe protocols"),
    (lambda r, s: s.update(supportedModelFormats=[{"name": "pytorch"}]), "modelFormat .* not among"),
    (lambda r, s: s.update(disabled=True), "is disabled"),
    (lambda r, s: s["containers"][0].update(name="torchserve"), "no container named kserve-container"),
    (lambda r, s: s["containers"][0]["ports"][0].update(containerPort=8080),
     "first containerPort 8080 .* is not config.properties' inference port 8085"),
    (lambda r, s: s["containers"][0].update(args=["torchserve", "--foreground", "--model-store", "/mnt/models",
                                                  "--ts-config", "/mnt/models/config/config.properties"]),
     "args --model-store is '/mnt/models', model-root/ mounts it at /mnt/models/model-store"),
])
def test_a_runtime_the_inference_service_cannot_use_fails(out: Path, edit, match) -> None:
    runtime, spec = runtime_spec(out)
    edit(runtime, spec)
    save(out, "servingruntime.yaml", runtime)
    with pytest.raises(ValidationFailed, match=match):
        check(out)


def test_a_model_format_version_the_runtime_lacks_fails(out: Path) -> None:
    isvc = load(out, "inferenceservice.yaml")
    isvc["spec"]["predictor"]["model"]["modelFormat"]["version"] = "2"
    save(out, "inferenceservice.yaml", isvc)
    with pytest.raises(ValidationFailed, match="not among the runtime's supportedModelFormats"):
        check(out)


def test_a_missing_runtime_file_names_the_fix(out: Path) -> None:
    (out / "kserve" / "servingruntime.yaml").unlink()
    with pytest.raises(ValidationFailed, match="servingruntime.yaml missing: regenerate with make deploy"):
        check(out)
