"""The server's written thread plan: how many intra-op threads this model's workers get.

Several models share one server's cores, so no worker can work out its threads from its own model
alone. The tuner writes each model's share into config.properties, next to the frontend's values:

    models={"my_model": {"1.0": {..., "minWorkers": 1, "maxWorkers": 1, "threads": 1}}, ...}

TorchServe ignores the `threads` key; the worker reads it here. A worker learns the file's path
from TS_CONFIG_FILE, the variable TorchServe's own launcher reads before --ts-config (so the two
never name different files) and which the frontend passes on to its workers' environment.
`make serve`, the image's entry point, KServe's manifest and benchmarks/serving/launcher.py set it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional

from handlers import properties
from handlers.errors import ConfigError

CONFIG_ENV = "TS_CONFIG_FILE"
THREADS_KEY = "threads"


def planned_threads(model: str, version: str, environ: Mapping[str, str] = os.environ) -> Optional[int]:
    """The written thread count for this model's version, or None where no plan names it."""
    path = environ.get(CONFIG_ENV, "").strip()
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{CONFIG_ENV}={path}: cannot read the server's config.properties ({exc})") from exc
    raw = properties.parse(text).get("models", "").strip()
    if not raw:
        return None
    try:
        models = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: models= is not valid JSON ({exc})") from exc
    entry = (models.get(model) or {}).get(version) if isinstance(models, dict) else None
    if not isinstance(entry, dict) or THREADS_KEY not in entry:
        return None
    threads = entry[THREADS_KEY]
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"{path}: models.{model}.{version}.{THREADS_KEY} must be an integer >= 1, got {threads!r} "
                          "(re-tune, or set it by hand)")
    return threads
