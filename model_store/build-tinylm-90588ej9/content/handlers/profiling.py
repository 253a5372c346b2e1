"""torch.profiler hook, switched on by TorchServe's own ENABLE_TORCH_PROFILER=true.

Off (the default) means no profiler object at all: the hot path only enters null contexts.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Optional

import psutil
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from handlers.settings import ProfilerSettings

log = logging.getLogger(__name__)

ENV_SWITCH = "ENABLE_TORCH_PROFILER"


def profiler_requested(environ=os.environ) -> bool:
    return environ.get(ENV_SWITCH, "").strip().lower() == "true"


def default_trace_root() -> Path:
    """<server working dir>/logs/torch_profiler: the frontend (our parent) runs in the server's dir."""
    try:
        server_dir = Path(psutil.Process().parent().cwd())
    except (psutil.Error, AttributeError):
        server_dir = Path.cwd()
    return server_dir / "logs" / "torch_profiler"


class StageProfiler:
    """A scheduled torch.profiler whose named regions mark the handler's stages."""

    def __init__(self, settings: ProfilerSettings, model_name: str, cuda: bool):
        root = Path(settings.trace_dir) if settings.trace_dir else default_trace_root()
        self.trace_dir = root / model_name
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        self._top = settings.top_operators
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self._profile = profile(
            activities=activities,
            schedule=schedule(
                wait=settings.wait, warmup=settings.warmup, active=settings.active, repeat=settings.repeat
            ),
            on_trace_ready=self._write_trace,
            record_shapes=True,
        )
        self._profile.start()
        log.info("torch profiler on: traces go to %s", self.trace_dir)

    def _write_trace(self, prof) -> None:
        path = self.trace_dir / f"trace-{os.getpid()}-step{prof.step_num}.json"
        prof.export_chrome_trace(str(path))
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=self._top)
        log.info("profiler trace written to %s; top operators:\n%s", path, table)

    def region(self, name: str):
        return record_function(name)

    def step(self) -> None:
        self._profile.step()

    def stop(self) -> None:
        self._profile.stop()


def make_profiler(settings: ProfilerSettings, model_name: str, cuda: bool) -> Optional[StageProfiler]:
    if not profiler_requested():
        return None
    return StageProfiler(settings, model_name, cuda)


def region(profiler: Optional[StageProfiler], name: str):
    return profiler.region(name) if profiler is not None else contextlib.nullcontext()
