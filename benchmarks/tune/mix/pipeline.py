"""Tune one server for a traffic mix, end to end:

    cores by demand -> search (a whole server per candidate, all models loaded, mixed traffic)
      -> the same run's reference: the values the file had before (each model's alone tune, or an earlier mix tune)
      -> write config.properties (threads and the mix record) -> verify: the capacity again,
         from the written file, with longer points -> below the reference: write the values
         before back, and verify those -> report

One model is the special case of a mix of one.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from benchmarks.load.environment import describe_environment
from benchmarks.load.mix import Mix
from benchmarks.tune.config_writer import Provenance, Update
from benchmarks.tune.mix import report
from benchmarks.tune.mix.measure import Capacity, PointSettings, measure_capacity
from benchmarks.tune.mix.plan import MixPlan, starting_plan
from benchmarks.tune.mix.search import SearchSettings, Tried, search
from benchmarks.tune.mix.writer import write_mix
from benchmarks.tune.outcome import machine
from benchmarks.tune.space import Candidate
from build.archive import build_entry
from build.catalogue import Catalogue
from serving.mix_record import MixRecord, ModelShare, read_mix
from serving.repo import CATALOGUE, REPO_ROOT, shown
from serving.ts_config import ModelSettings, ServerConfig

Progress = Callable[[str], None]
# How a mix tune's per-model records start their note (alone_values skips them).
SHARE_NOTE = "its share of the tuned mix"


@dataclass(frozen=True)
class MixOptions:
    mix: Mix
    cores: int
    config: Path
    model_store: Path
    folder: Path
    search: SearchSettings
    search_point: PointSettings  # the search's points
    final_point: PointSettings  # the reference and the verification: longer points
    write: bool
    command: str

    def to_json(self) -> dict:
        return {"mix": self.mix.to_json(), "cores": self.cores, "config": shown(self.config),
                "search": self.search.to_json(), "search_point": self.search_point.to_json(),
                "final_point": self.final_point.to_json(), "write": self.write, "command": self.command}


def alone_values(config_text: str, base: ServerConfig, names) -> dict[str, tuple[ModelSettings, Optional[float]]]:
    """Each model's values in the file and the capacity its alone-tuning recorded (None: never tuned
    alone; a record a mix tune wrote holds the model's share of the mix, not its capacity alone)."""
    out = {}
    known = set(base.model_names)
    for name in names:
        found = re.search(rf"^# tuned {re.escape(name)}: .*\n#   measured: ([0-9.]+) req/s at p99 [0-9.]+ ms "
                          rf"\((?!{re.escape(SHARE_NOTE)})", config_text, re.M)
        out[name] = (base.model(name).settings if name in known else ModelSettings(),
                     float(found.group(1)) if found else None)
    return out


def first_rate(mix: Mix, plan: MixPlan, cores: int, alone: dict[str, tuple[ModelSettings, Optional[float]]],
               recorded: Optional[MixRecord] = None) -> float:
    """Where the search starts: each model's alone capacity scaled to its cores, at its share; else,
    re-tuning the same mix, below the capacity its record holds; else low."""
    limits = [alone[n][1] * c.workers * c.threads / cores / mix.shares[n] for n, c in plan.models if alone[n][1]]
    if limits:
        return round(0.8 * min(limits), 1)
    if recorded is not None and set(recorded.shares) == set(mix.shares) and recorded.capacity_rps > 0:
        return round(0.8 * recorded.capacity_rps, 1)
    return 20.0


def tune_mix(options: MixOptions, progress: Progress) -> int:
    mix, folder = options.mix, options.folder
    folder.mkdir(parents=True, exist_ok=True)
    progress(f"mix {mix.label()}; budget {options.cores} cores; report {shown(folder)}")
    catalogue = Catalogue.load(CATALOGUE)
    for m in mix.names:
        build_entry(catalogue, m, REPO_ROOT, options.model_store, progress=progress)
    before = folder / "config.before.properties"
    shutil.copyfile(options.config, before)
    text = before.read_text(encoding="utf-8")
    base = ServerConfig.load(before)
    # Each model is served from the archive its entry names (marName: the variant its own tune chose).
    served = {m: base.model(m).archive if m in base.model_names else f"{m}.mar" for m in mix.names}
    archives = {m: options.model_store / served[m] for m in mix.names}
    alone = alone_values(text, base, mix.names)
    others = {e.name: e.settings for e in base.models}
    start = starting_plan(mix, options.cores, alone)
    start_rps = first_rate(mix, start, options.cores, alone, read_mix(before))
    progress(f"starting plan {start.key} at {start_rps:g} req/s")

    def measure(plan: MixPlan, rps: float, label: str) -> Capacity:
        return measure_capacity(label, mix, options.model_store, before, plan.settings(others), rps,
                                options.search_point, progress)

    tried, chosen = search(mix, options.cores, start, start_rps, measure, options.search, progress)
    progress(f"chosen: {chosen.plan.key} ({chosen.capacity.rate_rps:.1f} req/s in the search)")
    reference = measure_capacity("config.properties before", mix, options.model_store, before, None,
                                 max(1.0, 0.7 * chosen.capacity.rate_rps), options.final_point, progress)
    environment = describe_environment()
    written = options.config if options.write else folder / "config.tuned.properties"
    if not options.write:
        shutil.copyfile(before, written)
    loaded = tuple(base.startup_archives(options.model_store))  # every server of this tune loads these
    kept = file_plan(mix, base)

    def write(plan: MixPlan, measured: Capacity) -> None:
        updates = [Update(n, s, base.model(n).version if n in others else "1.0",
                          base.model(n).archive if n in others else f"{n}.mar")
                   for n, s in plan.settings(others).items()]
        record = _record(options, plan, measured, reference, environment, served, loaded, kept)
        write_mix(written, updates, _provenance(record, environment), record, _idle(others, mix), archives)

    def from_written(plan: MixPlan, provisional: Capacity, label: str) -> Capacity:
        write(plan, provisional)  # then the record gets the capacity measured from the written file
        progress(f"wrote {shown(written)}; verifying from it")
        measured = measure_capacity(label, mix, options.model_store, written, None,
                                    max(1.0, provisional.rate_rps), options.final_point, progress)
        write(plan, measured)
        return measured

    verified = from_written(chosen.plan, chosen.capacity, "tuned (from the written file)")
    rejected = None
    if below(verified, reference) and kept is not None and kept.key != chosen.plan.key:
        # The search ranks candidates on short points; the long ones decide: never write a regression.
        progress(f"the search's choice measured {verified.rate_rps:.1f} req/s from the written file, below the "
                 f"file's own values ({reference.rate_rps:.1f} req/s, same run): writing those back")
        rejected = Tried(chosen.plan, verified, "the search's choice, measured from the written file")
        chosen = Tried(kept, reference, "the values in config.properties before, kept")
        verified = from_written(kept, reference, "kept (from the written file)")
    record = _record(options, chosen.plan, verified, reference, environment, served, loaded, kept)
    content = report.build(options, alone, tried, chosen, reference, verified, record, environment, rejected)
    report.write(folder, content)
    report.print_summary(content, folder)
    return 0 if verified.best is not None else 1


def file_plan(mix: Mix, base: ServerConfig) -> Optional[MixPlan]:
    """The mix's models as the file before the tune planned them (None: a model without a thread plan)."""
    models = []
    for name in mix.names:
        if name not in base.model_names or base.model(name).settings.threads is None:
            return None
        s = base.model(name).settings
        models.append((name, Candidate(s.min_workers, s.threads, s.batch_size, s.max_batch_delay_ms)))
    return MixPlan(tuple(models))


def below(measured: Capacity, reference: Capacity) -> bool:
    """The written values served less than the file's own values did, in the same run."""
    return reference.best is not None and (measured.best is None or measured.rate_rps < reference.rate_rps)


def _idle(others: dict[str, ModelSettings], mix: Mix) -> tuple[str, ...]:
    return tuple(n for n in others if n not in mix.shares)


def _record(options: MixOptions, plan: MixPlan, measured: Capacity, reference: Capacity, environment: dict,
            served: dict[str, str], loaded: tuple[str, ...], before: Optional[MixPlan]) -> MixRecord:
    best = measured.best
    models = []
    for name, c in plan.models:
        rate = best.models[name]["achieved_rps"] if best else 0.0
        p99 = (best.model_p99_ms(name) or 0.0) if best else 0.0
        models.append(ModelShare(name, round(options.mix.shares[name], 4), options.mix.slo_ms[name], c.workers,
                                 c.threads, c.batch_size, c.max_batch_delay_ms, round(rate, 1), round(p99, 1),
                                 served[name]))
    return MixRecord(tuple(models), round(measured.rate_rps, 1), round(reference.rate_rps, 1), options.cores,
                     round(measured.memory_mib, 1), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     shown(options.folder), machine(environment), loaded,
                     unchanged=before is not None and before.key == plan.key)


def _provenance(record: MixRecord, environment: dict) -> tuple[Provenance, ...]:
    return tuple(Provenance(m.name, record.date, m.slo_ms,
                            ModelSettings(m.batch_size, m.max_batch_delay_ms, m.workers, m.workers, threads=m.threads),
                            m.threads, m.rate_rps, m.p99_ms, f"{SHARE_NOTE}, {record.capacity_rps:.1f} "
                            "req/s in all: see the mix record above", None, record.report, record.machine)
                 for m in record.models)
