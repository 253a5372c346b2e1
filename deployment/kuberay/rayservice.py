"""A KubeRay RayService for the tuned Ray Serve config, its image's Dockerfile, and their offline check.

Sizing comes from the Serve config (`make tune ENGINE=ray` writes it): one worker pod per replica
slot, as many pods as the apps' `num_replicas` add up to, each with the CPUs of the largest replica
(`ray_actor_options.num_cpus`, the tuned threads) as Ray's `num-cpus` and as the pod's requests =
limits (Guaranteed QoS, as the TorchServe Deployment); memory per pod a stated default unless given.
The head runs Serve's controller and HTTP proxy only (`num-cpus: 0`: no replica lands there).

serveConfigV2 is that Serve config with the image's paths: archives under MODEL_STORE, the unpack
folder in /tmp, TorchServe's key file from a Secret mounted at KEY_DIR (the replicas check the
inference key as TorchServe does), Serve's HTTP proxy on 0.0.0.0:8000 (the RayService's serve Service),
and the ingress app `make serve ENGINE=ray` deploys too (KServe v1, Open Inference Protocol v2, OpenAI
at /v1; serving/ray/routes.py), with TorchServe's request size limit on every app.

Checked offline: the manifest against KubeRay's RayService CRD (vendored under deployment/crds/,
made strict by deployment/crd.py, as the KServe ServingRuntime is), and serveConfigV2 against Ray
Serve's own schema (ServeDeploySchema) when Ray is installed.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from deployment import crd
from deployment.errors import DeployError, ValidationFailed
from serving.ray import routes_config, serve_config

CRD = ("ray.io_rayservices.yaml", "v1")
RAY_VERSION = "2.60.0"
BASE_IMAGE = f"rayproject/ray:{RAY_VERSION}-py311-cpu"
IMAGE_REF = "REGISTRY/ray-serve-archives:TAG"  # placeholder: the image built from deploy/kuberay/Dockerfile
HOME = "/home/ray"
MODEL_STORE = f"{HOME}/model_store"
KEY_DIR = f"{HOME}/keys"
KEY_SECRET = "ray-serve-keys"  # kubectl create secret generic ray-serve-keys --from-file=key_file.json
NAME = "ray-serve-archives"
HEAD_CPUS = 1
HEAD_MEMORY_MIB = 2048  # GCS, Serve's controller and proxy: ~1.3-1.45 GiB idle measured on this host
DEFAULT_WORKER_MEMORY_MIB = 4096  # per replica slot, a stated default (as the TorchServe Deployment's)
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
SERVE_LOCK = "requirements/serve.txt"  # the handlers' dependencies, TorchServe's Python package included


@dataclass(frozen=True)
class Sizing:
    worker_pods: int
    cpus_per_pod: int
    worker_memory_mib: int

    def explain(self) -> str:
        return (f"{self.worker_pods} worker pod(s) (the apps' num_replicas added up), {self.cpus_per_pod} CPU(s) each "
                f"(the largest replica's num_cpus), {self.worker_memory_mib} Mi each; head: {HEAD_CPUS} CPU, "
                f"{HEAD_MEMORY_MIB} Mi, no replicas")


def read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise DeployError(f"{path} not found: write it with  make tune ENGINE=ray  (Ray Serve's config file)")
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        config["applications"][0]["deployments"][0]  # noqa: B018 - the shape the rest reads
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError) as exc:
        raise DeployError(f"{path}: not a Ray Serve config with applications[].deployments[] ({exc})") from exc
    return config


def sizing(config: Mapping[str, Any], worker_memory_mib: int = DEFAULT_WORKER_MEMORY_MIB) -> Sizing:
    """Worker pods for the model apps' replicas (the ingress holds no CPU: it runs beside the head's proxy)."""
    deployments = [d for app in routes_config.model_apps(config) for d in app["deployments"]]
    replicas = sum(int(d.get("num_replicas", 1)) for d in deployments)
    cpus = max(int((d.get("ray_actor_options") or {}).get("num_cpus", 1)) for d in deployments)
    return Sizing(replicas, cpus, worker_memory_mib)


def image_config(config: Mapping[str, Any],
                 limits: routes_config.DoorLimits = routes_config.DEFAULT_LIMITS) -> dict[str, Any]:
    """The Serve config with the image's paths, the pod's address and the ingress app."""
    key_file = f"{KEY_DIR}/key_file.json"
    out = routes_config.with_ingress(config, key_file, limits)
    out["http_options"] = {"host": "0.0.0.0", "port": serve_config.SERVE_PORT}  # noqa: S104 - the pod's interface
    for app in routes_config.model_apps(out):
        args = app["args"]
        args.update(archive=f"{MODEL_STORE}/{Path(args['archive']).name}", unpack_root="/tmp", key_file=key_file)
    return out


def _container(name: str, cpus: int, memory_mib: int, ports: list[dict[str, Any]]) -> dict[str, Any]:
    amount = {"cpu": str(cpus), "memory": f"{memory_mib}Mi"}
    return {
        "name": name,
        "image": IMAGE_REF,
        "resources": {"requests": dict(amount), "limits": dict(amount)},
        "ports": ports,
        "volumeMounts": [{"name": "keys", "mountPath": KEY_DIR, "readOnly": True}],
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
    }


def _pod(container: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"containers": [container],
                     "volumes": [{"name": "keys", "secret": {"secretName": KEY_SECRET, "defaultMode": 0o400}}]}}


def manifest(config: Mapping[str, Any], size: Sizing,
             limits: routes_config.DoorLimits = routes_config.DEFAULT_LIMITS) -> dict[str, Any]:
    head_ports = [{"containerPort": 6379, "name": "gcs-server"}, {"containerPort": 8265, "name": "dashboard"},
                  {"containerPort": 10001, "name": "client"}, {"containerPort": serve_config.SERVE_PORT, "name": "serve"}]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": NAME}},
        "spec": {
            "serveConfigV2": yaml.safe_dump(image_config(config, limits), sort_keys=False),
            "rayClusterConfig": {
                "rayVersion": RAY_VERSION,
                "enableInTreeAutoscaling": False,
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                    "template": _pod(_container("ray-head", HEAD_CPUS, HEAD_MEMORY_MIB, head_ports)),
                },
                "workerGroupSpecs": [{
                    "groupName": "replicas",
                    "replicas": size.worker_pods,
                    "minReplicas": size.worker_pods,
                    "maxReplicas": size.worker_pods,
                    "rayStartParams": {"num-cpus": str(size.cpus_per_pod)},
                    "template": _pod(_container("ray-worker", size.cpus_per_pod, size.worker_memory_mib, [])),
                }],
            },
        },
    }


def dockerfile(config: Mapping[str, Any]) -> str:
    archives = sorted({Path(app["args"]["archive"]).name for app in routes_config.model_apps(config)})
    copies = "".join(f"COPY --chown=ray model_store/{name} {MODEL_STORE}/{name}\n" for name in archives)
    return (f"# The image the RayService runs (deploy/kuberay/rayservice.yaml): Ray {RAY_VERSION}, the handlers'\n"
            "# dependencies, serving/ (the Serve app) and the archives. Build from the repository root:\n"
            f"#   docker build -f deploy/kuberay/Dockerfile -t {IMAGE_REF} .\n"
            f"FROM {BASE_IMAGE}\n"
            f"COPY --chown=ray {SERVE_LOCK} {HOME}/requirements.txt\n"
            f"RUN pip install --no-cache-dir --extra-index-url {TORCH_CPU_INDEX} -r {HOME}/requirements.txt\n"
            f"COPY --chown=ray serving/ {HOME}/app/serving/\n"
            f"{copies}"
            f"ENV PYTHONPATH={HOME}/app\n"
            f"WORKDIR {HOME}\n")


def _models(annotation: Any) -> list[type]:
    """The pydantic model classes an annotation holds (X, Optional[X], list[X], ...)."""
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def unknown_fields(model: type, value: Any, path: str = "") -> list[str]:
    """Keys of `value` that `model` (a pydantic model, recursively) does not declare, as dotted paths."""
    if isinstance(value, list):
        return [u for i, item in enumerate(value) for u in unknown_fields(model, item, f"{path}[{i}]")]
    if not isinstance(value, dict):
        return []
    fields = {alias: f for name, f in model.model_fields.items() for alias in (name, f.alias) if alias}
    out = []
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            out.append(where)
            continue
        for inner in _models(fields[key].annotation)[:1]:
            out += unknown_fields(inner, item, where)
    return out


def validate(doc: Mapping[str, Any], where: str = "rayservice.yaml") -> str:
    """The manifest against KubeRay's CRD (strict), serveConfigV2 against Ray Serve's schema."""
    schema = crd.load(*CRD)
    errors = sorted(jsonschema.Draft202012Validator(schema.schema).iter_errors(dict(doc)),
                    key=lambda e: list(e.absolute_path))
    if errors:
        lines = "; ".join(f"at {'.'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}" for e in errors[:5])
        raise ValidationFailed(f"{where}: {lines} (KubeRay's CRD {schema.source}, strict)")
    try:
        from ray.serve.schema import ServeDeploySchema
    except ImportError:
        return f"{where}: valid ({schema.source}, strict; serveConfigV2 unchecked: Ray not installed)"
    served = yaml.safe_load(doc["spec"]["serveConfigV2"])
    try:
        ServeDeploySchema.model_validate(served)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ValidationFailed(f"{where}: serveConfigV2 is not a Ray Serve config: {exc}") from exc
    unknown = unknown_fields(ServeDeploySchema, served)
    if unknown:  # Serve's schema ignores them: a misspelt num_replicas would silently be the default
        raise ValidationFailed(f"{where}: serveConfigV2 is not a Ray Serve config: unknown field(s) "
                               f"{', '.join(unknown)} (Ray Serve {RAY_VERSION}'s ServeDeploySchema)")
    return f"{where}: valid ({schema.source}, strict; serveConfigV2: Ray Serve {RAY_VERSION}'s ServeDeploySchema)"


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (serveConfigV2) as YAML literal blocks: readable, and the same string."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_BlockDumper.add_representer(str, _str)


def write(config_path: Path, out: Path, worker_memory_mib: int = DEFAULT_WORKER_MEMORY_MIB,
          limits: routes_config.DoorLimits = routes_config.DEFAULT_LIMITS) -> tuple[Sizing, list[Path]]:
    config = read_config(config_path)
    size = sizing(config, worker_memory_mib)
    doc = manifest(config, size, limits)
    validate(doc)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "rayservice.yaml", out / "serve.yaml", out / "Dockerfile"]
    files[0].write_text(yaml.dump(doc, Dumper=_BlockDumper, sort_keys=False), encoding="utf-8")
    files[1].write_text(doc["spec"]["serveConfigV2"], encoding="utf-8")
    files[2].write_text(dockerfile(config), encoding="utf-8")
    return size, files
