"""What a finished search turns into: the written config.properties, its verification, the
report's content and the before/after table printed at the end."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

from benchmarks.serving.errors import LauncherError
from benchmarks.tune.config_writer import Provenance, Update, find_stanza, write_config
from benchmarks.tune.service_model import ServiceModel
from benchmarks.serving.ts_config import ServerConfig
from benchmarks.tune.judge import HeadToHead
from benchmarks.tune.search import CandidateResult, SearchResult, best_of
from benchmarks.tune.verify import Verification, verify
from benchmarks.serving.repo import REPO_ROOT, CATALOGUE

Progress = Callable[[str], None]
TARGET_SHARE_OF_BEST = 0.95
TARGET_SHARE_OF_TIME = 0.15


def machine(environment: dict) -> str:
    return (f"{environment.get('cpu')}, {environment.get('physical_cores')} cores, torch {environment.get('torch')}, "
            f"torchserve {environment.get('torchserve')}, git {environment.get('git_commit')}")


def _shown(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _provenance(cfg, chosen: CandidateResult, defaults: Optional[CandidateResult], environment: dict,
                verification: Optional[Verification], note: str) -> Provenance:
    point = verification.confirmed if verification is not None and verification.confirmed else chosen.best
    return Provenance(
        model=cfg.model, date=time.strftime("%Y-%m-%d %H:%M %Z"), slo_ms=cfg.slo_ms,
        settings=chosen.candidate.settings(), threads=chosen.candidate.threads,
        throughput_rps=point.achieved_rps, p99_ms=point.p99_ms,
        verified=verification.summary() if verification is not None else note,
        defaults_rps=defaults.throughput_rps if defaults else None, report=_shown(Path(cfg.folder)),
        machine=machine(environment))


def write_and_verify(cfg, result: SearchResult, defaults: Optional[CandidateResult], environment: dict,
                     archive: Path, checkpoint, progress: Progress) -> Tuple[Optional[dict], Optional[Verification]]:
    """Write the chosen values (unless --no-write), then verify them (unless --no-verify)."""
    chosen = result.chosen
    if chosen is None:
        progress(f"no candidate met p99 <= {cfg.slo_ms:g} ms at any measured rate: nothing written "
                 "(a larger SLO, or a quieter machine?)")
        return None, None
    if cfg.no_write:
        progress("--no-write: config.properties left alone")
        return None, None
    config = Path(cfg.config)
    try:
        previous = ServerConfig.load(config).model(cfg.model).settings.to_json()
    except LauncherError:  # no entry for the model yet: nothing to show as "before"
        previous = None
    catalogue_version = _catalogue_version(cfg.model)
    update = Update(cfg.model, chosen.candidate.settings(), version=catalogue_version, archive=archive.name)
    note = "search only, not verified" if cfg.no_verify else "verification pending"
    text = write_config(config, [update], [_provenance(cfg, chosen, defaults, environment, None, note)],
                        archives={cfg.model: archive})
    progress(f"wrote {chosen.candidate.label} into {config}")
    verification = None
    if not cfg.no_verify:
        saved = checkpoint.get("verification")
        if saved is not None:
            verification = Verification.from_json(saved, cfg.slo_ms)
            progress(f"verification replayed from the checkpoint: {verification.summary()}")
        else:
            verification = verify(cfg.model, config, Path(cfg.model_store), chosen.candidate,
                                  chosen.best.rate_rps, cfg.slo_ms, cfg.load, progress,
                                  backoff=cfg.search_settings.rates.resolution, wait_quiet_s=cfg.wait_quiet)
            checkpoint.put("verification", verification.to_json())
        text = write_config(config, [update], [_provenance(cfg, chosen, defaults, environment, verification, "")],
                            archives={cfg.model: archive})
    lines = text.splitlines(keepends=True)
    first, end = find_stanza(lines)
    return {"path": str(config), "previous": previous, "stanza": "".join(lines[first:end])}, verification


def _catalogue_version(model: str) -> str:
    from build.catalogue import Catalogue

    return str(Catalogue.load(CATALOGUE).entry(model).version)


def grid_comparison(result: SearchResult, fit_s: float, grid: Sequence[CandidateResult],
                    judged: Optional[HeadToHead] = None) -> Optional[dict]:
    """The pick against the grid's best. What decides the throughput target is the quality of
    the choice, measured the same way on both sides: the head-to-head when one was run, else the
    grid's own measurement of the pick (same ladder as its best), else the search's."""
    best, pick = best_of(grid), result.chosen
    if best is None or pick is None:
        return None
    tuner_s, grid_s = fit_s + result.seconds, sum(r.seconds for r in grid)
    in_grid = next((r for r in grid if r.candidate.behaviour == pick.candidate.behaviour), None)
    share = pick.throughput_rps / best.throughput_rps
    share_in_grid = in_grid.throughput_rps / best.throughput_rps if in_grid else None
    decisive = judged.share if judged else share_in_grid if share_in_grid is not None else share
    time_share = tuner_s / grid_s
    ok = decisive >= TARGET_SHARE_OF_BEST and time_share <= TARGET_SHARE_OF_TIME
    sentence = (
        f"The tuner's pick `{pick.candidate.key}` served {pick.throughput_rps:.1f} req/s within the SLO in the "
        f"search, {share:.0%} of the grid's best (`{best.candidate.key}`, {best.throughput_rps:.1f} req/s)"
        + (f"; in the grid's own measurements the pick reached {share_in_grid:.0%} of the best" if in_grid else "")
        + (f"; head to head ({len(judged.pick)} rate searches each, ABBA order, same ladder from "
           f"{judged.start_rps:.0f} req/s) the pick served {judged.pick_rps:.1f} req/s on average against "
           f"{judged.best_rps:.1f}: {judged.share:.0%}" if judged else "")
        + f". It spent {tuner_s:.0f} s measuring (in-process fit included) against the grid's {grid_s:.0f} s: "
        f"{time_share:.1%} of the time. Targets (>= {TARGET_SHARE_OF_BEST:.0%} of the best, judged "
        f"{'head to head' if judged else 'in the grid' if in_grid else 'by the search'}: {decisive:.0%}; <= "
        f"{TARGET_SHARE_OF_TIME:.0%} of the time): {'met' if ok else 'NOT met'}.")
    return {"sentence": sentence, "tuner_key": pick.candidate.key, "tuner_rps": pick.throughput_rps,
            "grid_key": best.candidate.key, "grid_rps": best.throughput_rps, "share_of_best": share,
            "pick_share_in_grid": share_in_grid, "head_to_head": judged.to_json() if judged else None,
            "decisive_share": decisive, "tuner_s": tuner_s, "grid_s": grid_s, "share_of_time": time_share,
            "tuner_candidates": len(result.results), "grid_candidates": len(grid),
            "tuner_points": sum(len(r.points) for r in result.results),
            "grid_points": sum(len(r.points) for r in grid), "targets_met": ok}


def _row(label: str, r: Optional[CandidateResult], point=None) -> Optional[dict]:
    if r is None:
        return None
    point = point or r.best
    return {"label": label, **r.candidate.to_json(), "throughput_rps": point.achieved_rps if point else 0.0,
            "p99_ms": point.p99_ms if point else None}


def _conditions(conditions: dict) -> dict:
    """Measurement hygiene in one sentence: was anything else running when servers started?"""
    starts = conditions.get("starts") or []
    loads = [s["load_average"][0] for s in starts]
    crowded = sum(1 for s in starts if s["other_torchserve_pids"] or (s.get("cpu_pct") or 0) >= 20)
    waited = sum(s.get("waited_s") or 0 for s in starts)
    note = ("At every server start no other TorchServe was up" + (
        f" and the machine was idle (CPU < 20% over 2 s; {waited:.0f} s spent waiting for that)." if waited or
        any("cpu_pct" in s for s in starts) else ".") if not crowded else
        f"Other jobs (TorchServe servers or CPU >= 20%) were running at {crowded} of {len(starts)} server starts: "
        "they shared the 2 cores, so these numbers carry that noise.")
    return {**conditions, "note": note, "max_load_at_starts": max(loads) if loads else None,
            "starts_with_others": crowded, "starts": len(starts), "each_start": starts}


def build_report(cfg, fit: dict, service: ServiceModel, result: SearchResult, defaults: Optional[CandidateResult],
                 grid: Optional[Sequence[CandidateResult]], conditions: dict, environment: dict,
                 written: Optional[dict], verification: Optional[Verification],
                 judged: Optional[HeadToHead] = None) -> dict:
    chosen = result.chosen
    fit_s = float(fit.get("seconds", 0.0))
    rows = [_row("TorchServe defaults", defaults), _row("tuned (search)", chosen)]
    if verification is not None and chosen is not None:
        rows.append(_row("tuned, verified from the written file", chosen,
                         verification.confirmed or (verification.points[-1] if verification.points else None)))
    verdict = "No candidate met the SLO."
    if chosen is not None:
        verdict = (f"At p99 <= {cfg.slo_ms:g} ms, {cfg.model} serves {chosen.throughput_rps:.1f} req/s tuned "
                   f"({chosen.candidate.label})")
        if defaults is not None and defaults.throughput_rps > 0:
            verdict += (f", {chosen.throughput_rps / defaults.throughput_rps:.2f}x TorchServe's defaults "
                        f"({defaults.throughput_rps:.1f} req/s)")
        verdict += "." + (f" Written to {written['path']}; {verification.summary()}." if written and verification
                          else f" Written to {written['path']} (not verified)." if written else " Not written.")
    return {
        "model": cfg.model, "slo_ms": cfg.slo_ms, "started": "-".join(Path(cfg.folder).name.split("-")[-2:]),
        "command": cfg.command, "options": cfg.options, "verdict": verdict,
        "space": cfg.space.to_json(), "space_size": len(cfg.space.candidates()),
        "fit": {"points": fit["points"], "seconds": fit_s, "model": service.to_json()},
        "calibrated_model": result.model.to_json(),
        "first_predictions": [{"key": p.candidate.key, **p.to_json()} for p in result.first_predictions[:15]],
        "defaults": defaults.to_json() if defaults else None,
        "search": [r.to_json() for r in result.results], "stop_reason": result.stop_reason,
        "chosen": chosen.to_json() if chosen else None,
        "timing": {"fit_s": fit_s, "search_s": result.seconds, "tuner_s": fit_s + result.seconds,
                   "defaults_s": defaults.seconds if defaults else None,
                   "grid_s": sum(r.seconds for r in grid) if grid else None},
        "grid": [r.to_json() for r in grid] if grid else None,
        "grid_comparison": grid_comparison(result, fit_s, grid, judged) if grid else None,
        "before_after": [r for r in rows if r is not None],
        "config_written": written, "verification": verification.to_json() if verification else None,
        "conditions": _conditions(conditions), "environment": environment,
    }


def print_summary(report: dict, folder: Path) -> None:
    print(f"\n{report['model']} (SLO p99 <= {report['slo_ms']:g} ms)")
    print(f"  {'configuration':<40}{'batch':>6}{'delay':>7}{'w x t':>7}{'req/s':>9}{'p99 ms':>9}")
    for row in report["before_after"]:
        p99 = "-" if row["p99_ms"] is None else f"{row['p99_ms']:.1f}"
        print(f"  {row['label']:<40}{row['batch_size']:>6}{row['max_batch_delay_ms']:>7}"
              f"{row['workers']:>4} x{row['threads']:>2}{row['throughput_rps']:>9.1f}{p99:>9}")
    print(f"  {report['verdict']}")
    if report.get("grid_comparison"):
        print(f"  {report['grid_comparison']['sentence']}")
    print(f"  report: {folder / 'report.md'}")
