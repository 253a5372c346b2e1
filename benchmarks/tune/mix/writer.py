"""Write a mix plan into config.properties: every model's values (threads included) in models=,
per-model provenance records, and the mix record (benchmarks/tune/mix/record.py) above them.

Models outside the mix keep their batch and delay and get one worker of one thread; their old
records (which described values tuned alone) are dropped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Mapping, Sequence

from benchmarks.serving import properties
from benchmarks.serving.ts_config import parse_models
from benchmarks.tune.config_writer import (
    HEADER,
    RECORD_MORE,
    RECORD_PREFIX,
    Provenance,
    Update,
    check_archives,
    rewrite,
)
from benchmarks.tune.errors import ConfigWriteError
from benchmarks.tune.mix.record import MIX_PREFIX, MORE, MixRecord
from benchmarks.tune.mix.record import RECORD_PREFIX as MIX_RECORD


def _without_mix_block(lines: List[str]) -> List[str]:
    out, inside = [], False
    for line in lines:
        if line.startswith(MIX_PREFIX):
            inside = True
            continue
        if inside and line.startswith(MORE):
            continue
        if line.startswith(MIX_RECORD):
            inside = False
            continue
        inside = False
        out.append(line)
    return out


def _without_records(lines: List[str], models: Sequence[str]) -> List[str]:
    out, dropping = [], False
    for line in lines:
        if line.startswith(RECORD_PREFIX):
            dropping = line[len(RECORD_PREFIX):].split(":", 1)[0] in models
        elif not line.startswith(RECORD_MORE):
            dropping = False
        if not dropping:
            out.append(line)
    return out


def rewrite_mix(text: str, updates: Sequence[Update], records: Sequence[Provenance], mix: MixRecord,
                dropped_records: Sequence[str]) -> str:
    new = rewrite(text, updates, records)
    newline = "\r\n" if "\r\n" in new else "\n"
    lines = _without_records(_without_mix_block(new.splitlines()), dropped_records)
    at = next((i for i, line in enumerate(lines) if line == HEADER or line.startswith("models=")), len(lines))
    lines[at:at] = list(mix.lines())
    return newline.join(lines) + newline


def _tuned(settings) -> tuple:
    if settings is None:
        return ()
    return (settings.batch_size, settings.max_batch_delay_ms, settings.min_workers, settings.max_workers,
            settings.threads)


def write_mix(path: Path, updates: Sequence[Update], records: Sequence[Provenance], mix: MixRecord,
              dropped_records: Sequence[str], archives: Mapping[str, Path]) -> str:
    """Check the archives, rewrite `path` in place (atomically) and return the new text."""
    check_archives(archives)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigWriteError(f"cannot read {path}: {exc}") from exc
    new = rewrite_mix(text, updates, records, mix, dropped_records)
    written = {e.name: e.settings for e in parse_models(properties.parse(new).get("models", ""))}
    for update in updates:  # read back as TorchServe and the workers will, before the file is replaced
        if _tuned(written.get(update.name)) != _tuned(update.settings):
            raise ConfigWriteError(f"internal error: {update.name}'s values do not read back from the new text")
    tmp = path.with_name(f".{path.name}.tuner-tmp")
    tmp.write_text(new, encoding="utf-8", newline="")
    os.replace(tmp, path)
    return new
