"""Offline validation of deploy/: every Kubernetes manifest against one fixed Kubernetes
version's schemas (kubernetes-validate bundles them), strict, so unknown fields are errors; the
ServingRuntime against KServe's own CRD (vendored, made strict: deployment/crd.py); the
InferenceService against our own schema of the fields we use, written from KServe's CRD
(inferenceservice.schema.json); the two against each other as KServe's controller pairs them. Also:
the image's and KServe's config.properties parse, keep token auth on, register no workflow from a
URL and keep management on loopback.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import yaml

from deployment import crd, kserve_runtime
from deployment.errors import DeployError, ValidationFailed
from deployment.layout import KSERVE
from serving.ts_config import ServerConfig, lock_problems

KUBERNETES_VERSION = "1.33.0"
ISVC_SCHEMA = Path(__file__).with_name("inferenceservice.schema.json")
RUNTIME_CRD = ("serving.kserve.io_servingruntimes.yaml", "v1alpha1")


def _docs(path: Path) -> list[dict]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    except yaml.YAMLError as exc:
        raise ValidationFailed(f"{path}: not YAML ({exc})") from exc
    if not docs or not all(isinstance(d, dict) for d in docs):
        raise ValidationFailed(f"{path}: expected one or more YAML mappings")
    return docs


def _where(error: jsonschema.ValidationError) -> str:
    path = error.absolute_path
    return ".".join(str(p) for p in path) or "(top level)"


def check_kubernetes(path: Path) -> str:
    import kubernetes_validate  # imported here: only --check needs it

    for doc in _docs(path):
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise ValidationFailed(f"{path}: {doc.get('kind')} at {_where(exc)}: {exc.message} "
                                   f"(Kubernetes {KUBERNETES_VERSION} schema, strict)") from exc
        except kubernetes_validate.SchemaNotFoundError as exc:
            raise ValidationFailed(f"{path}: no schema for {doc.get('apiVersion')} {doc.get('kind')} "
                                   f"in Kubernetes {KUBERNETES_VERSION}") from exc
    return f"{path.name}: valid (Kubernetes {KUBERNETES_VERSION}, strict)"


def _check_schema(path: Path, schema: dict, source: str) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    for doc in _docs(path):
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
        if errors:
            lines = "; ".join(f"at {_where(e)}: {e.message}" for e in errors[:5])
            raise ValidationFailed(f"{path}: {lines} ({source})")


def check_inference_service(path: Path) -> str:
    _check_schema(path, json.loads(ISVC_SCHEMA.read_text(encoding="utf-8")), f"{ISVC_SCHEMA.name}, from KServe's CRD")
    return f"{path.name}: valid ({ISVC_SCHEMA.name}, strict)"


def check_serving_runtime(path: Path) -> str:
    found = crd.load(*RUNTIME_CRD)
    _check_schema(path, found.schema, f"KServe's CRD {found.source}, strict")
    return f"{path.name}: valid (KServe's {found.kind} CRD {found.api_version}, strict)"


def _one(path: Path) -> dict:
    docs = _docs(path)
    if len(docs) != 1:
        raise ValidationFailed(f"{path}: expected one document, found {len(docs)}")
    return docs[0]


def check_kserve_pair(isvc_path: Path, runtime_path: Path, config_path: Path) -> str:
    """The InferenceService's predictor lands on our runtime, as KServe's controller decides it
    (by name, not disabled, protocol and model format supported), and the runtime's argv and port
    match the model-root/ layout and its config.properties."""
    model = _one(isvc_path)["spec"]["predictor"]["model"]
    runtime = _one(runtime_path)
    spec, name = runtime["spec"], runtime["metadata"]["name"]
    wrong = []
    if model.get("runtime") != name:
        wrong.append(f"spec.predictor.model.runtime is {model.get('runtime')!r}, the runtime is {name!r}")
    if spec.get("disabled"):
        wrong.append(f"runtime {name} is disabled")
    protocol, protocols = model.get("protocolVersion"), spec.get("protocolVersions")
    if protocol and protocols and protocol not in protocols:
        wrong.append(f"protocolVersion {protocol} not in the runtime's {protocols}")
    unknown = set(protocols or ()) - {"v1", "v2", "grpc-v1", "grpc-v2"}
    if unknown:
        wrong.append(f"protocolVersions {sorted(unknown)} are not KServe protocols")
    if _format_label(model["modelFormat"]) not in _runtime_labels(spec):
        wrong.append(f"modelFormat {model['modelFormat']} is not among the runtime's supportedModelFormats")
    containers = {c["name"]: c for c in spec.get("containers", ())}
    container = containers.get(kserve_runtime.CONTAINER)
    if container is None:
        wrong.append(f"the runtime has no container named {kserve_runtime.CONTAINER} (KServe merges the model into it)")
    else:
        wrong += _argv_problems(container, ServerConfig.load(config_path))
    if wrong:
        raise ValidationFailed(f"{isvc_path.name} + {runtime_path.name}: {'; '.join(wrong)}")
    return f"{isvc_path.name} names {name}: format, protocol, argv and port agree"


def _format_label(fmt: dict) -> str:
    """KServe's label for an InferenceService's model format (ModelSpec.getModelFormatLabel)."""
    return f"mt:{fmt['name']}" + (f":{fmt['version']}" if fmt.get("version") is not None else "")


def _runtime_labels(spec: dict) -> set[str]:
    """The labels a runtime named by the InferenceService offers: every format, autoSelect or not."""
    labels = set()
    for fmt in spec.get("supportedModelFormats", ()):
        labels.add(f"mt:{fmt['name']}")
        if fmt.get("version") is not None:
            labels.add(f"mt:{fmt['name']}:{fmt['version']}")
    return labels


def _argv_problems(container: dict, config: ServerConfig) -> list[str]:
    args = container.get("args", [])
    wrong = []
    for flag, expected in (("--model-store", KSERVE.model_store), ("--ts-config", KSERVE.config)):
        got = args[args.index(flag) + 1] if flag in args[:-1] else None
        if got != expected:
            wrong.append(f"args {flag} is {got!r}, model-root/ mounts it at {expected}")
    ports = container.get("ports") or [{}]
    served = config.address("inference_address").rsplit(":", 1)[1]
    if str(ports[0].get("containerPort")) != served:
        wrong.append(f"first containerPort {ports[0].get('containerPort')} (where KServe sends traffic) is not "
                     f"config.properties' inference port {served}")
    return wrong


def _host(address: str) -> str | None:
    """The host of `http://host:port` (REST) or of a bare gRPC address."""
    return urlsplit(address if "://" in address else f"//{address}").hostname


def check_config(path: Path) -> str:
    config = ServerConfig.load(path)
    wrong = [f"{k}={config.get(k)!r}" for k, v in (("disable_token_authorization", "false"),
                                                  ("enable_model_api", "false")) if config.get(k) != v]
    wrong += lock_problems(config.properties)
    wrong += [f"{k}={config.get(k)!r}" for k in ("management_address", "grpc_management_address")
              if _host(config.get(k, "")) != "127.0.0.1"]
    if wrong or not config.models:
        raise ValidationFailed(f"{path}: {', '.join(wrong) or 'no models='} (token auth must stay on, the "
                               "model API off, no workflow from a URL, management on 127.0.0.1, models= present): "
                               "regenerate with make deploy")
    return (f"{path.name}: token auth on, model API off, no workflow from a URL, management on loopback, "
            f"{len(config.models)} model(s)")


def check(out: Path, progress: Callable[[str], None] = print) -> None:
    if not (out / "k8s").is_dir():
        raise DeployError(f"{out}/k8s not found: generate it first (make deploy)")
    checks = [(p, check_kubernetes) for p in sorted((out / "k8s").glob("*.yaml"))]
    kserve = out / "kserve"
    checks += [(kserve / "servingruntime.yaml", check_serving_runtime),
               (kserve / "inferenceservice.yaml", check_inference_service),
               (out / "image" / "config.properties", check_config),
               (kserve / "model-root" / "config" / "config.properties", check_config)]
    for path, run in checks:
        if not path.is_file():
            raise ValidationFailed(f"{path} missing: regenerate with make deploy")
        progress(f"[check] {path.relative_to(out)}: {run(path).partition(': ')[2]}")
    pair = check_kserve_pair(kserve / "inferenceservice.yaml", kserve / "servingruntime.yaml",
                             kserve / "model-root" / "config" / "config.properties")
    progress(f"[check] kserve/: {pair}")
