"""Is the plan in config.properties true of what it loads? Read by `make serve` (a warning before
the server starts) and by the tuner after it writes the file.

Two things can make it untrue:
- the cores budget: every loaded model's workers x threads is what the server will run on the
  machine's cores; a model tuned alone assumed it had all of them;
- the mix record: its capacity, cores and memory were measured with a set of models loaded and
  with its own per-model values; a model added, removed or re-tuned since makes it a figure of
  another server.
"""

from __future__ import annotations

from typing import Optional

from serving.mix_record import MixRecord, ModelShare
from serving.ts_config import ModelEntry, ServerConfig

MIX_FIX = "make tune MIX=<model>=<share>,... naming every model load_models loads"


def record_mismatches(entry: ModelEntry, share: ModelShare) -> list[str]:
    """The models= values of one model that differ from those its mix record was measured with."""
    s = entry.settings
    found = {"minWorkers": s.min_workers, "maxWorkers": s.max_workers, "threads": s.threads,
             "batchSize": s.batch_size, "maxBatchDelay": s.max_batch_delay_ms, "marName": entry.archive}
    wanted = {"minWorkers": share.workers, "maxWorkers": share.workers, "threads": share.threads,
              "batchSize": share.batch_size, "maxBatchDelay": share.max_batch_delay_ms,
              "marName": share.served_archive}
    return [f"{k}={found[k]!r} (record: {wanted[k]})" for k in wanted if found[k] != wanted[k]]


def planned_threads(entry: ModelEntry) -> int:
    """Intra-op threads the model's workers run together (a worker without a plan: at least one)."""
    return entry.settings.min_workers * (entry.settings.threads or 1)


def plan_problems(config: ServerConfig, loaded: list[str], record: Optional[MixRecord], cores: int) -> list[str]:
    """Why the written plan does not hold for the models `loaded` on `cores` cores; empty when it does."""
    by_name = {e.name: e for e in config.models}
    problems: list[str] = []
    if record is not None:
        mixed = {m.name for m in record.models}
        if not record.loaded:
            problems.append("the mix record does not say which models were loaded when it was measured: "
                            f"re-tune ({MIX_FIX})")
        elif set(record.loaded) != set(loaded):
            added, gone = sorted(set(loaded) - set(record.loaded)), sorted(set(record.loaded) - set(loaded))
            what = "; ".join(p for p in (f"loaded now but not then: {', '.join(added)}" if added else "",
                                         f"loaded then but not now: {', '.join(gone)}" if gone else "") if p)
            problems.append(f"the mix record was measured with other models loaded ({what}): its capacity, cores "
                            f"and memory are another server's; re-tune ({MIX_FIX})")
        for share in record.models:
            entry = by_name.get(share.name)
            wrong = ["not in models="] if entry is None else record_mismatches(entry, share)
            if wrong:
                problems.append(f"{share.name} differs from the mix record ({', '.join(wrong)}): it was re-tuned or "
                                f"edited after the mix; re-tune the mix ({MIX_FIX})")
        busy = [by_name[n] for n in loaded if n in by_name and n in mixed]
        idle = [by_name[n] for n in loaded if n in by_name and n not in mixed and planned_threads(by_name[n]) > 1]
        for entry in idle:
            problems.append(f"{entry.name} is outside the mix but planned for {planned_threads(entry)} threads "
                            f"({entry.settings.min_workers} worker(s) x {entry.settings.threads or 1}): as an idle "
                            f"model it should have 1 worker x 1 thread; re-tune ({MIX_FIX})")
    else:
        busy = [by_name[n] for n in loaded if n in by_name]
    total = sum(planned_threads(e) for e in busy)
    if total > cores:
        parts = ", ".join(f"{e.name} {e.settings.min_workers} x {e.settings.threads or 1}" for e in busy)
        problems.append(f"the plan runs {total} intra-op threads ({parts}) on {cores} cores: models tuned alone "
                        f"each assumed the cores were theirs; tune them together ({MIX_FIX})")
    return problems
