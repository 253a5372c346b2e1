"""The ingress app's entry in a Serve config file (serving/ray/routes.py is the app itself), and the
request size limit every app of ours applies. Imports nothing of Ray: the launcher, the tuner and the
KubeRay manifest write config files without starting it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

DEFAULT_MAX_REQUEST_SIZE = 6553500  # TorchServe's max_request_size when config.properties sets none
INGRESS_APP = "ingress"
INGRESS_DEPLOYMENT = "Ingress"
IMPORT_PATH = "serving.ray.routes:build"


def application(models: list[str], key_file: str, max_request_size: int) -> dict[str, Any]:
    """The ingress: one small replica at the root prefix (each model's own app keeps /predictions/<model>,
    the longer prefix); it holds no CPU of the plan's (num_cpus 0)."""
    return {
        "name": INGRESS_APP,
        "route_prefix": "/",
        "import_path": IMPORT_PATH,
        "args": {"models": list(models), "key_file": key_file, "max_request_size": max_request_size},
        "deployments": [{"name": INGRESS_DEPLOYMENT, "num_replicas": 1, "max_ongoing_requests": 1000,
                         "ray_actor_options": {"num_cpus": 0}}],
    }


def model_apps(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The apps of a Serve config file that serve a model (the ingress left out)."""
    return [app for app in config["applications"] if app.get("import_path") != IMPORT_PATH]


def with_ingress(config: Mapping[str, Any], key_file: str, max_request_size: int) -> dict[str, Any]:
    """A copy of a Serve config whose model apps take the size limit, with the ingress app serving the
    other routes (KServe v1, Open Inference Protocol v2, OpenAI at /v1) for those models; an ingress
    the file already has is replaced."""
    out = yaml.safe_load(yaml.safe_dump(dict(config)))  # a deep copy
    apps = model_apps(out)
    for app in apps:
        app["args"]["max_request_size"] = max_request_size
    out["applications"] = [*apps, application([app["args"]["model"] for app in apps], key_file, max_request_size)]
    return out
