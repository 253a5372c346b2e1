"""Ray Serve's config file for a set of archives: the file `serve deploy` and KubeRay's RayService
take, written by the launcher for each cluster it starts.

Per model: TorchServe's batchSize -> the app's `max_batch_size`, maxBatchDelay -> `batch_wait_timeout_s`
(both in the app's args, read at start-up, and in the deployment's `user_config`, which Serve applies
through `reconfigure` and lets an operator change without a restart), minWorkers -> `num_replicas`,
threads -> `num_cpus` per replica, responseTimeout -> Serve's `request_timeout_s` (one for the whole
cluster: the largest of its models'; past it Serve answers 408 where TorchServe's frontend gives up on
the worker). Values come from the caller's ModelSettings, else from the archive's
model-config.yaml, else TorchServe's defaults.

The file the tuner writes (`make tune ENGINE=ray`) is portable: archives named relative to the model
store (`model_store/<name>.mar`), no key file, Serve's default port. `read` turns it back into plans;
`localise` fills in one cluster's paths and port, and the KubeRay manifest its image's paths.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from serving.errors import ConfigError
from serving.ray.routes_config import DEFAULT_LIMITS, DEPLOYMENT, DoorLimits
from serving.ts_config import ModelSettings, ServerConfig

IMPORT_PATH = "serving.ray.app:build"
SERVE_PORT = 8000  # Serve's default HTTP port (the RayService's serve Service targets it)
PORTABLE_UNPACK_ROOT = "/tmp"


def configured_limits(config_properties: Path) -> DoorLimits:
    """max_request_size and job_queue_size as a config.properties sets them (TorchServe's defaults otherwise)."""
    config = ServerConfig.load(config_properties)
    values = {}
    for key in ("max_request_size", "job_queue_size"):
        value = (config.get(key, "") or "").strip()
        if value:
            try:
                values[key] = int(value)
            except ValueError:
                raise ConfigError(f"{config_properties}: {key}={value}: it must be an integer") from None
    try:
        return DoorLimits(**values)
    except ValueError as err:
        raise ConfigError(f"{config_properties}: {err}") from None


def archive_settings(mar: Path) -> ModelSettings:
    """The frontend values an archive's model-config.yaml gives (TorchServe's defaults for the rest)."""
    try:
        with zipfile.ZipFile(mar) as archive:
            names = set(archive.namelist())
            raw = yaml.safe_load(archive.read("model-config.yaml")) if "model-config.yaml" in names else {}
    except (OSError, zipfile.BadZipFile, yaml.YAMLError) as exc:
        raise ConfigError(f"{mar}: cannot read model-config.yaml ({exc}); rebuild it: .venv/bin/python -m build") from exc
    raw = raw or {}
    workers = int(raw.get("minWorkers", 1))
    return ModelSettings(batch_size=int(raw.get("batchSize", 1)), max_batch_delay_ms=int(raw.get("maxBatchDelay", 100)),
                         min_workers=workers, max_workers=max(workers, int(raw.get("maxWorkers", workers))),
                         response_timeout_s=int(raw.get("responseTimeout", ModelSettings.response_timeout_s)))


@dataclass(frozen=True)
class AppPlan:
    """One model served by one Serve app at /predictions/<model>."""

    model: str
    archive: Path
    settings: ModelSettings

    def application(self, unpack_root: Path | str, key_file: Optional[Path | str], archive: Optional[str] = None,
                    max_replicas_per_node: Optional[int] = None) -> dict[str, Any]:
        s = self.settings
        batching = {"max_batch_size": s.batch_size, "batch_wait_timeout_s": s.max_batch_delay_ms / 1000.0}
        deployment: dict[str, Any] = {
            "name": DEPLOYMENT,
            "num_replicas": s.min_workers,
            # What TorchServe's queue and batch hold (serving/ray/routes_config.py): Serve's defaults (5
            # ongoing, an unbounded queue) would keep batches from filling and queue without bound.
            **DEFAULT_LIMITS.replica_limits(s.batch_size),
            "ray_actor_options": {"num_cpus": s.threads or 1},
            "user_config": batching,
        }
        if max_replicas_per_node is not None:
            deployment["max_replicas_per_node"] = max_replicas_per_node
        return {
            "name": self.model,
            "route_prefix": f"/predictions/{self.model}",
            "import_path": IMPORT_PATH,
            "args": {
                "model": self.model,
                "archive": str(self.archive) if archive is None else archive,
                "unpack_root": str(unpack_root),
                "key_file": "" if key_file is None else str(key_file),
                **batching,
            },
            "deployments": [deployment],
        }


def plans(model_store: Path, models: tuple[str, ...], settings: Mapping[str, ModelSettings]) -> tuple[AppPlan, ...]:
    unknown = sorted(set(settings) - set(models))
    if unknown:
        raise ConfigError(f"settings for {unknown[0]!r}, which is not among the models served ({', '.join(models)})")
    out = []
    for model in models:
        mar = (model_store / f"{model}.mar").resolve()
        if not mar.is_file():
            raise ConfigError(f"missing in {model_store}: {mar.name} (build it: .venv/bin/python -m build)")
        out.append(AppPlan(model, mar, settings.get(model) or archive_settings(mar)))
    return tuple(out)


def http_options(apps: tuple[AppPlan, ...], port: int) -> dict[str, Any]:
    """Loopback, the port, and the longest a request may wait for its answer: no request waits on
    Serve's router or a replica without bound (a replica lost mid-request among them)."""
    return {"host": "127.0.0.1", "port": port,
            "request_timeout_s": float(max(app.settings.response_timeout_s for app in apps))}


def serve_config(apps: tuple[AppPlan, ...], http_port: int, unpack_root: Path, key_file: Optional[Path],
                 max_replicas_per_node: Optional[int] = None) -> dict[str, Any]:
    """One cluster's file: local archives, its key file, its port (the launcher's)."""
    return {
        "proxy_location": "HeadOnly",
        "http_options": http_options(apps, http_port),
        "applications": [app.application(unpack_root, key_file, max_replicas_per_node=max_replicas_per_node)
                         for app in apps],
    }


def portable(apps: tuple[AppPlan, ...], max_replicas_per_node: Optional[int] = None) -> dict[str, Any]:
    """The tuner's file: archives relative to the model store, no key file, Serve's default port."""
    return {
        "proxy_location": "HeadOnly",
        "http_options": http_options(apps, SERVE_PORT),
        "applications": [app.application(PORTABLE_UNPACK_ROOT, None, f"model_store/{app.archive.name}",
                                          max_replicas_per_node) for app in apps],
    }


def _setting(app: Mapping[str, Any], deployment: Mapping[str, Any], key: str, default: Any) -> Any:
    user = deployment.get("user_config") or {}
    return user.get(key, (app.get("args") or {}).get(key, default))


def read(path: Path, model_store: Path) -> tuple[AppPlan, ...]:
    """The plans a Serve config file of ours describes, archives found in `model_store`."""
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        timeout = (config.get("http_options") or {}).get("request_timeout_s")
        response_timeout_s = ModelSettings.response_timeout_s if timeout is None else int(float(timeout))
        out = []
        for app in config["applications"]:
            (deployment,) = [d for d in app["deployments"] if d["name"] == DEPLOYMENT]
            threads = (deployment.get("ray_actor_options") or {}).get("num_cpus", 1)
            replicas = int(deployment.get("num_replicas", 1))
            settings = ModelSettings(batch_size=int(_setting(app, deployment, "max_batch_size", 1)),
                                     max_batch_delay_ms=round(1000 * float(_setting(app, deployment,
                                                                                    "batch_wait_timeout_s", 0.1))),
                                     min_workers=replicas, max_workers=replicas, threads=int(threads),
                                     response_timeout_s=response_timeout_s)
            out.append(AppPlan(app["args"]["model"], (model_store / Path(app["args"]["archive"]).name).resolve(),
                               settings))
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: not a Serve config of ours ({type(exc).__name__}: {exc}); write it with "
                          "make tune ENGINE=ray") from exc
    missing = [a.archive.name for a in out if not a.archive.is_file()]
    if missing:
        raise ConfigError(f"{path} serves {', '.join(missing)}, missing in {model_store} (build: .venv/bin/python -m build)")
    return tuple(out)


def localise(config: Mapping[str, Any], model_store: Path, http_port: int, unpack_root: Path,
             key_file: Optional[Path]) -> dict[str, Any]:
    """A portable file made runnable on one cluster here: its archives, port, unpack folder and key file."""
    out = yaml.safe_load(yaml.safe_dump(dict(config)))  # a deep copy
    out["http_options"] = {**(out.get("http_options") or {}), "host": "127.0.0.1", "port": http_port}
    for app in out["applications"]:
        args = app["args"]
        args.update(archive=str((model_store / Path(args["archive"]).name).resolve()), unpack_root=str(unpack_root),
                    key_file="" if key_file is None else str(key_file))
    return out


def write(path: Path, config: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    return path
