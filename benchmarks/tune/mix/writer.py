"""Write a mix plan into config.properties: every model's values (threads included) in models=,
per-model provenance records, and the mix record (serving/mix_record.py) above them.

Models outside the mix keep their batch and delay and get one worker of one thread; their old
records (which described values tuned alone) are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.tune.config_writer import (
    HEADER,
    RECORD_MORE,
    RECORD_PREFIX,
    Provenance,
    Update,
    rewrite,
    write_config,
)
from serving.mix_record import MIX_PREFIX, MORE, MixRecord
from serving.mix_record import RECORD_PREFIX as MIX_RECORD


def _without_mix_block(lines: list[str]) -> list[str]:
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


def _without_records(lines: list[str], models: Sequence[str]) -> list[str]:
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


def write_mix(path: Path, updates: Sequence[Update], records: Sequence[Provenance], mix: MixRecord,
              dropped_records: Sequence[str], archives: Mapping[str, Path]) -> str:
    """Check the archives, rewrite `path` in place (atomically) and return the new text."""
    return write_config(path, updates, records, archives,
                        rewrite_text=lambda text: rewrite_mix(text, updates, records, mix, dropped_records))
