"""What a finished search turns into: the chosen values written into config.properties (with
a provenance record), then verified from the written file on a real server."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from benchmarks.tune.checkpoint import Checkpoint
from benchmarks.tune.config_writer import Provenance, Update, find_stanza, write_config
from benchmarks.tune.measure import ServePlan
from benchmarks.tune.results import CandidateResult
from benchmarks.tune.verify import Verification, VerifySettings, verify
from serving.errors import LauncherError
from serving.repo import shown
from serving.ts_config import ServerConfig

Progress = Callable[[str], None]


@dataclass(frozen=True)
class WritePlan:
    serve: ServePlan  # the model, its archive store, the config.properties to write, the load to verify with
    write: bool
    verify: bool
    version: str  # the archive's version: the models= entry's key
    resolution: float  # the verification's rate search stops at this bracket ratio (the search's)
    checks: VerifySettings
    report: Path  # the report folder the provenance record points to


def machine(environment: dict) -> str:
    return (f"{environment.get('cpu')}, {environment.get('physical_cores')} cores, torch {environment.get('torch')}, "
            f"torchserve {environment.get('torchserve')}, git {environment.get('git_commit')}")


def _provenance(plan: WritePlan, chosen: CandidateResult, defaults: Optional[CandidateResult], environment: dict,
                verification: Optional[Verification], note: str) -> Provenance:
    point = verification.confirmed if verification is not None and verification.confirmed else chosen.best
    return Provenance(
        model=plan.serve.model, date=time.strftime("%Y-%m-%d %H:%M %Z"), slo_ms=plan.serve.slo_ms,
        settings=chosen.candidate.settings(), threads=chosen.candidate.threads,
        throughput_rps=point.achieved_rps, p99_ms=point.p99_ms,
        verified=verification.summary() if verification is not None else note,
        defaults_rps=defaults.throughput_rps if defaults else None, report=shown(plan.report),
        machine=machine(environment))


def write_and_verify(plan: WritePlan, chosen: Optional[CandidateResult], defaults: Optional[CandidateResult],
                     environment: dict, archive: Path, checkpoint: Checkpoint,
                     progress: Progress) -> tuple[Optional[dict], Optional[Verification]]:
    """Write the chosen values (unless plan.write is off), then verify them (unless plan.verify is off)."""
    model, config = plan.serve.model, plan.serve.config
    if chosen is None:
        progress(f"no candidate met p99 <= {plan.serve.slo_ms:g} ms at any measured rate: nothing written "
                 "(a larger SLO, or a quieter machine?)")
        return None, None
    if not plan.write:
        progress("--no-write: config.properties left alone")
        return None, None
    try:
        previous = ServerConfig.load(config).model(model).settings.to_json()
    except LauncherError:  # no entry for the model yet: nothing to show as "before"
        previous = None
    update = Update(model, chosen.candidate.settings(), version=plan.version, archive=archive.name)
    note = "search only, not verified" if not plan.verify else "verification pending"
    text = write_config(config, [update], [_provenance(plan, chosen, defaults, environment, None, note)],
                        archives={model: archive})
    progress(f"wrote {chosen.candidate.label} into {shown(config)}")
    verification = None
    if plan.verify:
        saved = checkpoint.get("verification")
        if saved is not None:
            verification = Verification.from_json(saved, plan.serve.slo_ms)
            progress(f"verification replayed from the checkpoint: {verification.summary()}")
        else:
            verification = verify(plan.serve, chosen.candidate, chosen.best.rate_rps, plan.checks,
                                  plan.resolution, progress)
            checkpoint.put("verification", verification.to_json())
        text = write_config(config, [update], [_provenance(plan, chosen, defaults, environment, verification, "")],
                            archives={model: archive}, check_plan=False)
    lines = text.splitlines(keepends=True)
    first, end = find_stanza(lines)
    return {"path": shown(config), "previous": previous, "stanza": "".join(lines[first:end])}, verification
