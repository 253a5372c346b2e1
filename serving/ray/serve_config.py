"""Ray Serve's config file for a set of archives: the file `serve deploy` and KubeRay's RayService
take, written by the launcher for each cluster it starts.

Per model: TorchServe's batchSize -> the app's `max_batch_size`, maxBatchDelay -> `batch_wait_timeout_s`,
minWorkers -> `num_replicas`, threads -> `num_cpus` per replica. Values come from the caller's
ModelSettings, else from the archive's model-config.yaml, else TorchServe's defaults.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from serving.errors import ConfigError
from serving.ts_config import ModelSettings

IMPORT_PATH = "serving.ray.app:build"
DEPLOYMENT = "Archive"  # the one deployment of each app (serving/ray/app.py)
# TorchServe's job_queue_size: requests a replica holds, waiting ones included (Serve's default is 5,
# which would keep batches from filling).
QUEUE_SIZE = 100


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
                         min_workers=workers, max_workers=max(workers, int(raw.get("maxWorkers", workers))))


@dataclass(frozen=True)
class AppPlan:
    """One model served by one Serve app at /predictions/<model>."""

    model: str
    archive: Path
    settings: ModelSettings

    def application(self, unpack_root: Path, key_file: Optional[Path]) -> dict[str, Any]:
        s = self.settings
        return {
            "name": self.model,
            "route_prefix": f"/predictions/{self.model}",
            "import_path": IMPORT_PATH,
            "args": {
                "model": self.model,
                "archive": str(self.archive),
                "unpack_root": str(unpack_root),
                "key_file": "" if key_file is None else str(key_file),
                "max_batch_size": s.batch_size,
                "batch_wait_timeout_s": s.max_batch_delay_ms / 1000.0,
            },
            "deployments": [{
                "name": DEPLOYMENT,
                "num_replicas": s.min_workers,
                "max_ongoing_requests": max(QUEUE_SIZE, s.batch_size),
                "ray_actor_options": {"num_cpus": s.threads or 1},
            }],
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


def serve_config(apps: tuple[AppPlan, ...], http_port: int, unpack_root: Path, key_file: Optional[Path]) -> dict[str, Any]:
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": http_port},
        "applications": [app.application(unpack_root, key_file) for app in apps],
    }


def write(path: Path, config: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    return path
