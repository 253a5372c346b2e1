"""A config.properties with a mix record, for the deployment tests: the repository's file with
models= set to the mix's values (threads included) and a MixRecord's lines placed above models=."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from serving.mix_record import MixRecord, ModelShare
from serving.properties import read
from serving.ts_config import ModelEntry, ModelSettings, format_models

# name -> (share, slo_ms, workers, threads, batch, delay_ms)
SHARES = {"minilm": (0.7, 50.0, 1, 1, 6, 1), "efficientnet_lite0": (0.3, 100.0, 1, 1, 3, 2)}


def mix_record(shares: Mapping[str, tuple] = SHARES, capacity_rps: float = 250.0,
               memory_mib: float | None = 1800.0) -> MixRecord:
    models = tuple(ModelShare(name=n, share=s, slo_ms=slo, workers=w, threads=t, batch_size=b,
                              max_batch_delay_ms=d, rate_rps=capacity_rps * s, p99_ms=slo * 0.8)
                   for n, (s, slo, w, t, b, d) in shares.items())
    return MixRecord(models=models, capacity_rps=capacity_rps, baseline_rps=None,
                     cores=sum(m.workers * m.threads for m in models), memory_mib=memory_mib,
                     date="2026-11-23 05:00 UTC", report="benchmarks/reports/test", machine="test")


def write_mix_config(source: Path, dest: Path, record: MixRecord) -> Path:
    """`source` with models= replaced by the record's values and the record above it."""
    props = read(source)
    entries = tuple(ModelEntry(name=m.name, settings=ModelSettings(
        batch_size=m.batch_size, max_batch_delay_ms=m.max_batch_delay_ms, min_workers=m.workers,
        max_workers=m.workers, threads=m.threads)) for m in record.models)
    lines = [f"{k}={v}" for k, v in props.items() if k != "models"]
    lines += [*record.lines(), f"models={format_models(entries)}"]
    dest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dest
