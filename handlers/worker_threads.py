"""A worker's intra-op threads, from the configuration its frontend started from, however it was
started (handlers/frontend.py finds it, handlers/plan.py reads the plan in it)."""

from __future__ import annotations

import logging
from typing import Optional

from handlers import frontend, plan, runtime
from handlers.settings import RuntimeSettings

log = logging.getLogger(__name__)


def worker_threads(settings: RuntimeSettings, model_name: str, version: str,
                   own_min_workers: Optional[int]) -> tuple[int, str]:
    """The thread count, and where it came from (for the worker's ready line)."""
    server = frontend.find_frontend()
    source = frontend.locate(server) if server is not None else None
    planned = plan.planned_threads(source, model_name, version)
    if source is None:  # in-process, not under TorchServe: this model has the cores to itself
        workers: Optional[int] = runtime.sibling_worker_count()
    else:
        loaded = plan.loaded_workers(source, model_name, own_min_workers)
        workers = loaded.total
        warning = plan.snapshot_warning(source)
        if warning:
            log.warning("%s: %s", model_name, warning)
        if planned is None and settings.threads is None:
            log.warning("%s: no thread plan for version %s in %s; %s. %s", model_name, version,
                        source.describe(), loaded.unknown or f"sharing the cores among {workers} workers",
                        plan.FIX)
    threads, reason = runtime.thread_budget(settings, planned, workers, runtime.usable_cores())
    where = source.describe() if source is not None else "not under TorchServe"
    return threads, f"{reason}; config {where}"
