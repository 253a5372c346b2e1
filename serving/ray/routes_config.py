"""The ingress app's entry in a Serve config file (serving/ray/routes.py is the app itself), and the
request size limit every app of ours applies. Imports nothing of Ray: the launcher and the tuner
write config files without starting it."""

from __future__ import annotations

from typing import Any

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
