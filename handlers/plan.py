"""The server's written thread plan: how many intra-op threads this model's workers get.

Several models share one server's cores, so no worker can work out its threads from its own model
alone. The tuner writes each model's share into config.properties, next to the frontend's values:

    models={"my_model": {"1.0": {..., "minWorkers": 1, "maxWorkers": 1, "threads": 1}}, ...}

TorchServe ignores the `threads` key; the worker reads it from the configuration the frontend
started from, however it was started (handlers/frontend.py). A snapshot keeps `models=` as it was
read, `threads` included. Where no plan names this model, the cores are shared among every
loaded model's workers, as far as the configuration tells how many there are.

On a GPU host (`gpu_plan`, which `make deploy GPU=1` writes) the placement is TorchServe's: one
worker per GPU for each model, gpu_ids round robin; a GPU worker's threads are its CPU side (JPEG
decoding, tokenising, the host copies), so the cores are shared among the GPU workers, and its
batch is a device's, not the CPU tune's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from handlers import properties
from handlers.errors import ConfigError
from handlers.frontend import ConfigSource

THREADS_KEY = "threads"
FIX = ("run `make tune` (it writes each model's threads into config.properties' models=), "
       "or set runtime.threads in the model's catalogue entry")


def models_table(source: ConfigSource) -> dict[str, Any]:
    raw = source.properties.get("models", "").strip()
    if not raw:
        return {}
    try:
        models = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source.describe()}: models= is not valid JSON ({exc})") from exc
    if not isinstance(models, dict):
        raise ConfigError(f"{source.describe()}: models= must be a JSON object of model names")
    return models


def _version_entry(models: Mapping[str, Any], model: str, version: Optional[str]) -> Optional[dict]:
    versions = models.get(model)
    if not isinstance(versions, dict) or not versions:
        return None
    if version is not None and isinstance(versions.get(version), dict):
        return versions[version]
    if version is None:
        default = [v for v in versions.values() if isinstance(v, dict) and v.get("defaultVersion")]
        return default[0] if default else next((v for v in versions.values() if isinstance(v, dict)), None)
    return None


def planned_threads(source: Optional[ConfigSource], model: str, version: str) -> Optional[int]:
    """The written thread count for this model's version, or None where no plan names it."""
    if source is None:
        return None
    entry = _version_entry(models_table(source), model, version)
    if entry is None or THREADS_KEY not in entry:
        return None
    threads = entry[THREADS_KEY]
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"{source.describe()}: models.{model}.{version}.{THREADS_KEY} must be an integer >= 1, "
                          f"got {threads!r} (re-tune, or set it by hand)")
    return threads


@dataclass(frozen=True)
class LoadedWorkers:
    """Workers per loaded model as the configuration states them, or why that cannot be known."""

    per_model: Mapping[str, int]
    unknown: str = ""  # non-empty: the reason the count is unknown

    @property
    def total(self) -> Optional[int]:
        return None if self.unknown else sum(self.per_model.values())


def _workers(entry: Optional[dict], default: int) -> int:
    value = (entry or {}).get("minWorkers", default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def visible_gpus() -> int:
    """The GPUs this host's workers can see (0 without a CUDA build of torch or a device)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _default_workers(props: Mapping[str, str], gpus: Optional[int] = None) -> int:
    """TorchServe 0.12's default_workers_per_model (ConfigManager.getDefaultWorkers): the setting,
    else one per GPU (number_of_gpu, which the frontend caps at the GPUs it finds), else one per
    CPU. Its workers take gpu_id round robin over those GPUs (WorkLoadManager.addThreads)."""
    configured = _int(props.get("default_workers_per_model"))
    if configured > 0:
        return configured
    found = visible_gpus() if gpus is None else gpus
    asked = _int(props.get("number_of_gpu"), default=found)
    return min(found, asked) if min(found, asked) > 0 else (os.cpu_count() or 1)


# A model's batch on a GPU where no tune on the device wrote one: the smallest of the tuner's gpu space
# (benchmarks/tune/space.py) at which a forward pass stops being launch-bound on the shipped models.
GPU_BATCH_SIZE = 32


@dataclass(frozen=True)
class GpuPlan:
    """One model's values on a GPU host: `workers` (minWorkers = maxWorkers) one per GPU, `threads`
    per worker (its decode pool and host-side work), `batch_size` for the device."""

    workers: int
    threads: int
    batch_size: int


def gpu_plan(gpus: int, cores: int, gpu_models: int, tuned_batch: int = 1) -> GpuPlan:
    """The plan for each of `gpu_models` models served on `gpus` GPUs with `cores` CPUs for their
    workers: one worker per GPU per model (TorchServe's default placement, ConfigManager.getDefaultWorkers),
    the cores shared among those workers (at least one thread each), and a batch of at least
    GPU_BATCH_SIZE (a CPU tune's larger batch is kept)."""
    if gpus < 1 or gpu_models < 1:
        raise ConfigError(f"a GPU plan needs GPUs and models on them, got {gpus} GPU(s) and {gpu_models} model(s)")
    workers = gpus
    return GpuPlan(workers=workers, threads=max(1, cores // (workers * gpu_models)),
                   batch_size=max(GPU_BATCH_SIZE, tuned_batch))


def _int(value: Optional[str], default: int = 0) -> int:
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


def loaded_workers(source: ConfigSource, model: str, own_workers: Optional[int] = None) -> LoadedWorkers:
    """Every loaded model's workers. `own_workers`: this model's, where its archive sets minWorkers
    (an archive's model-config.yaml overrides config.properties; other archives are not opened)."""
    props = source.properties
    if source.is_snapshot:
        return _snapshot_workers(source, model, own_workers)
    names = _load_models(source)
    if names is None:
        return LoadedWorkers({}, "load_models is 'all' or unset: which models load depends on the model store")
    table = models_table(source)
    default = _default_workers(props)
    counts = {name: _workers(_version_entry(table, name, None), default) for name in names}
    if own_workers is not None:
        counts[model] = own_workers
    return LoadedWorkers(counts)


def _load_models(source: ConfigSource) -> Optional[tuple[str, ...]]:
    """Model names that load at start (torchserve --models overrides load_models), None if unknown."""
    items = source.frontend.values("-m", "--models") or tuple(
        item for item in source.properties.get("load_models", "").split(",") if item.strip())
    names = []
    for item in (i.strip() for i in items):
        if item.lower() in ("all", "standalone"):
            return None
        name, sep, archive = item.partition("=")
        names.append(name if sep else os.path.basename(name).split(".")[0])
    return tuple(names) or None


def _snapshot_workers(source: ConfigSource, model: str, own_workers: Optional[int]) -> LoadedWorkers:
    try:
        snapshot = json.loads(source.properties.get("model_snapshot", ""))
        models = snapshot["models"]
        counts = {name: sum(_workers(v, 1) for v in versions.values()) for name, versions in models.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return LoadedWorkers({}, f"its model_snapshot is unreadable ({exc})")
    if own_workers is not None:
        counts[model] = own_workers
    return LoadedWorkers(counts)


def snapshot_warning(source: ConfigSource) -> Optional[str]:
    """Why a frontend started from a snapshot may be running old values, or None.

    `torchserve --start` without --ts-config or --ncs reads the newest logs/config snapshot instead
    of ./config.properties; an edit of config.properties made since then is ignored.
    """
    if not source.is_snapshot:
        return None
    beside = source.frontend.cwd / "config.properties"
    fix = (f"to run {beside} instead, start with `torchserve --start --model-store model_store --ts-config "
           f"config.properties --ncs` (make serve does), or delete {source.path.parent}")
    try:
        current = properties.read(beside)
    except OSError:
        return f"TorchServe started from the snapshot {source.path}, not from a config.properties; {fix}"
    if current.get("models", "").strip() != source.properties.get("models", "").strip():
        return (f"TorchServe started from the snapshot {source.path}, whose models= (batch sizes, workers, "
                f"thread plan) differ from {beside}: the snapshot's values are running; {fix}")
    return None
