"""Reading a TorchServe working directory's logs: whole files, failure counts, error-message tails."""

from __future__ import annotations

import re
from pathlib import Path

LOG_FILES = ("ts_log.log", "model_log.log")
_LOG_RECORD = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
# Our own polling (access log) and the periodic metrics: noise in an error message.
_NOISE = re.compile(r"ACCESS_LOG|TS_METRICS|MetricCollector")
# How the frontend reports a worker process that died under it.
WORKER_DEATH = re.compile(r"worker died|worker disconnected|backend worker process died", re.IGNORECASE)


def read(workdir: Path, name: str) -> str:
    """Full text of logs/<name> (empty if absent)."""
    try:
        return (workdir / "logs" / name).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def load_failures(workdir: Path, model: str) -> int:
    """How many times a worker of `model` failed while starting/loading (distinct log lines)."""
    pattern = re.compile(rf"W-\d+-{re.escape(model)}_\S* State change WORKER_STARTED -> WORKER_ERROR")
    return len({line for line in read(workdir, "ts_log.log").splitlines() if pattern.search(line)})


def worker_deaths(text: str) -> list[str]:
    """The log lines of `text` that report a worker dying, each once (TorchServe doubles some)."""
    return list(dict.fromkeys(line.strip() for line in text.splitlines() if WORKER_DEATH.search(line)))


def tails(workdir: Path, lines: int = 40) -> str:
    """The last lines of ts_log/model_log (noise and doubled lines dropped) and of the JVM's
    console output that is not a log record (bind failures and stack traces only land there)."""
    parts = []
    for name in LOG_FILES:
        kept: list[str] = []
        for line in read(workdir, name).splitlines():
            if _NOISE.search(line) or (kept and kept[-1] == line):
                continue
            kept.append(line)
        if kept:
            parts.append(f"--- tail of logs/{name} ---\n" + "\n".join(kept[-lines:]))
    console = workdir / "console.log"
    if console.is_file():
        raw = console.read_text(errors="replace").splitlines()
        stray = [line for line in raw if line.strip() and not _LOG_RECORD.match(line)]
        if stray:
            parts.append("--- console output (not in the logs) ---\n" + "\n".join(stray[-lines:]))
    return "\n".join(parts) or f"(no logs in {workdir})"
