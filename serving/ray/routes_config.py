"""The ingress app's entry in a Serve config file (serving/ray/routes.py is the app itself), and the
limits every app of ours applies at its door: a request body's size (max_request_size) and the
requests a replica holds (job_queue_size waiting, besides a batch in progress; past them a 503, as
TorchServe's full job queue answers: Serve's own replica limits, set here, refuse them before any
code of ours runs). Imports nothing of Ray: the launcher, the tuner and the KubeRay
manifest write config files without starting it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from serving.ray.worker_setup import SETUP_HOOK

DEFAULT_MAX_REQUEST_SIZE = 6553500  # TorchServe's max_request_size when config.properties sets none
DEFAULT_JOB_QUEUE_SIZE = 100  # TorchServe's job_queue_size when config.properties sets none
INGRESS_APP = "ingress"
INGRESS_DEPLOYMENT = "Ingress"
DEPLOYMENT = "Archive"  # the one deployment of each model app (serving/ray/app.py)
IMPORT_PATH = "serving.ray.routes:build"


@dataclass(frozen=True)
class DoorLimits:
    """config.properties' max_request_size and job_queue_size (TorchServe's defaults where it sets none)."""

    max_request_size: int = DEFAULT_MAX_REQUEST_SIZE
    job_queue_size: int = DEFAULT_JOB_QUEUE_SIZE

    def __post_init__(self) -> None:
        for key in ("max_request_size", "job_queue_size"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"{key} = {getattr(self, key)}: it must be a positive integer")

    def held(self, batch_size: int) -> int:
        """What one replica holds at most: the waiting requests and a batch in progress."""
        return self.job_queue_size + batch_size

    def replica_limits(self, batch_size: int) -> dict[str, int]:
        """A model deployment's Serve limits: `held` requests ongoing in a replica (its batcher's queue
        and batch; an LM's engine admits from them), and job_queue_size more waiting for a slot, past
        which Serve answers 503 at once, in the replica's HTTP server (or the caller's router) before
        any code of ours runs, in a few ms while the refusals fit on the replica's event loop beside its
        batches (docs/ray.md#what-differs-from-torchserve). Serve counts a request
        as waiting from its arrival until it takes a slot, so a smaller wait limit would refuse a burst
        the replica has room for."""
        return {"max_ongoing_requests": self.held(batch_size), "max_queued_requests": self.job_queue_size}


DEFAULT_LIMITS = DoorLimits()


def application(models: list[str], key_file: str, limits: DoorLimits) -> dict[str, Any]:
    """The ingress: one small replica at the root prefix (each model's own app keeps /predictions/<model>,
    the longer prefix); it holds no CPU of the plan's (num_cpus 0)."""
    return {
        "name": INGRESS_APP,
        "route_prefix": "/",
        "import_path": IMPORT_PATH,
        "args": {"models": list(models), "key_file": key_file, "max_request_size": limits.max_request_size,
                 "job_queue_size": limits.job_queue_size},
        "deployments": [{"name": INGRESS_DEPLOYMENT, "num_replicas": 1, "max_ongoing_requests": 1000,
                         "ray_actor_options": {"num_cpus": 0}}],
    }


def model_apps(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The apps of a Serve config file that serve a model (the ingress left out)."""
    return [app for app in config["applications"] if app.get("import_path") != IMPORT_PATH]


def with_ingress(config: Mapping[str, Any], key_file: str, limits: DoorLimits) -> dict[str, Any]:
    """A copy of a Serve config whose model apps take the door's limits, with the ingress app serving the
    other routes (KServe v1, Open Inference Protocol v2, OpenAI at /v1) for those models; an ingress
    the file already has is replaced. Each model deployment gets the Serve limits that hold what
    TorchServe's queue and batch hold (`DoorLimits.replica_limits`)."""
    out = yaml.safe_load(yaml.safe_dump(dict(config)))  # a deep copy
    apps = model_apps(out)
    for app in apps:
        app["args"]["max_request_size"] = limits.max_request_size
        app["args"].pop("job_queue_size", None)  # Serve's replica limits below hold it
        for deployment in app["deployments"]:
            batch = int((deployment.get("user_config") or {}).get("max_batch_size", app["args"].get("max_batch_size", 1)))
            deployment.update(limits.replica_limits(batch))
    out["applications"] = [*apps, application([app["args"]["model"] for app in apps], key_file, limits)]
    for app in out["applications"]:
        # a runtime_env's own hook wins
        app.setdefault("runtime_env", {}).setdefault("worker_process_setup_hook", SETUP_HOOK)
    return out
