"""Offline validation of deploy/: every Kubernetes manifest against one fixed Kubernetes
version's schemas (kubernetes-validate bundles them), strict, so unknown fields are errors; the
InferenceService (a CRD those schemas do not know) against our own schema of the fields we use,
written from KServe's CRD (inferenceservice.schema.json). Also: the image's and KServe's
config.properties parse and keep token auth on."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jsonschema
import yaml

from deployment.errors import DeployError, ValidationFailed
from serving.ts_config import ServerConfig

KUBERNETES_VERSION = "1.33.0"
ISVC_SCHEMA = Path(__file__).with_name("inferenceservice.schema.json")


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


def check_inference_service(path: Path) -> str:
    schema = json.loads(ISVC_SCHEMA.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    for doc in _docs(path):
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
        if errors:
            lines = "; ".join(f"at {_where(e)}: {e.message}" for e in errors)
            raise ValidationFailed(f"{path}: {lines} ({ISVC_SCHEMA.name}, from KServe's CRD)")
    return f"{path.name}: valid ({ISVC_SCHEMA.name}, strict)"


def check_config(path: Path) -> str:
    config = ServerConfig.load(path)
    wrong = [f"{k}={config.get(k)!r}" for k, v in (("disable_token_authorization", "false"),
                                                  ("enable_model_api", "false")) if config.get(k) != v]
    if wrong or not config.models:
        raise ValidationFailed(f"{path}: {', '.join(wrong) or 'no models='} (token auth must stay on, the "
                               "model API off, models= present): regenerate with make deploy")
    return f"{path.name}: token auth on, model API off, {len(config.models)} model(s)"


def check(out: Path, progress: Callable[[str], None] = print) -> None:
    if not (out / "k8s").is_dir():
        raise DeployError(f"{out}/k8s not found: generate it first (make deploy)")
    checks = [(p, check_kubernetes) for p in sorted((out / "k8s").glob("*.yaml"))]
    checks.append((out / "kserve" / "inferenceservice.yaml", check_inference_service))
    checks += [(out / "image" / "config.properties", check_config),
               (out / "kserve" / "model-root" / "config" / "config.properties", check_config)]
    for path, run in checks:
        if not path.is_file():
            raise ValidationFailed(f"{path} missing: regenerate with make deploy")
        progress(f"[check] {path.relative_to(out)}: {run(path).partition(': ')[2]}")
