"""The tuner's report: its content (`build`), and its folder: report.json, results.csv, report.md
and candidates.png.

report.json holds everything (inputs, every measured point, the fit, the choice, verification,
conditions on the machine); results.csv one row per open-loop point; report.md the tables a
reader wants: before/after and every measured candidate.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Optional

from benchmarks.load import cli, stats
from benchmarks.tune.options import TuneOptions
from benchmarks.tune.results import CandidateResult, Point
from benchmarks.tune.search import SearchResult
from benchmarks.tune.service_model import ServiceModel
from benchmarks.tune.verify import Verification
from serving.repo import shown

CSV_FIELDS = ("phase", "candidate", "workers", "threads", "batch_size", "max_batch_delay_ms", "rate_rps",
              "offered_rps", "achieved_rps", "p50_ms", "p90_ms", "p99_ms", "samples", "errors", "mean_batch",
              "stable", "passed", "seconds", "overhead_s", "others_cpu_pct")


def _row(label: str, r: Optional[CandidateResult], point=None) -> Optional[dict]:
    if r is None:
        return None
    point = point or r.best
    return {"label": label, **r.candidate.to_json(), "throughput_rps": point.achieved_rps if point else 0.0,
            "p99_ms": point.p99_ms if point else None, "p90_ms": point.p90_ms if point else None,
            "samples": point.samples if point else None}


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


def build(options: TuneOptions, fit: dict, service: ServiceModel, result: SearchResult,
          defaults: Optional[CandidateResult], conditions: dict, environment: dict, written: Optional[dict],
          verification: Optional[Verification]) -> dict:
    """The report's content: everything the run measured, chose, wrote and verified, as JSON."""
    chosen = result.chosen
    fit_s = float(fit.get("seconds", 0.0))
    rows = [_row("TorchServe defaults", defaults), _row("tuned (search)", chosen)]
    if verification is not None and chosen is not None:
        rows.append(_row("tuned, verified from the written file", chosen,
                         verification.confirmed or (verification.points[-1] if verification.points else None)))
    verdict = "No candidate met the SLO."
    if chosen is not None:
        verdict = (f"At p99 <= {options.slo_ms:g} ms, {options.model} serves {chosen.throughput_rps:.1f} req/s tuned "
                   f"({chosen.candidate.label})")
        if defaults is not None and defaults.throughput_rps > 0:
            verdict += (f", {chosen.throughput_rps / defaults.throughput_rps:.2f}x TorchServe's defaults "
                        f"({defaults.throughput_rps:.1f} req/s)")
        verdict += "." + (f" Written to {written['path']}; {verification.summary()}." if written and verification
                          else f" Written to {written['path']} (not verified)." if written else " config.properties not written.")
        confirmed = verification.confirmed if verification is not None else None
        if confirmed is not None:
            verdict += (f" Capacity from the written file, measured with the benchmark's point: "
                        f"{confirmed.achieved_rps:.1f} req/s at {stats.tail_text(confirmed.latency)} (the recorded "
                        "figure).")
    return {
        "model": options.model, "slo_ms": options.slo_ms, "started": "-".join(options.folder.name.split("-")[-2:]),
        "command": options.command, "options": {**options.record, "folder": shown(options.folder),
                                                "wait_quiet": options.wait_quiet_s},
        "verdict": verdict, "space": options.space.to_json(), "space_size": len(options.space.candidates()),
        "fit": {"points": fit["points"], "seconds": fit_s, "model": service.to_json()},
        "variant": fit.get("variant"), "variants": fit.get("variants"),
        "calibrated_model": result.model.to_json(),
        "first_predictions": [{"key": p.candidate.key, **p.to_json()} for p in result.first_predictions[:15]],
        "defaults": defaults.to_json() if defaults else None,
        "search": [r.to_json() for r in result.results], "stop_reason": result.stop_reason,
        "chosen": chosen.to_json() if chosen else None,
        "timing": {"fit_s": fit_s, "search_s": result.seconds, "tuner_s": fit_s + result.seconds,
                   "defaults_s": defaults.seconds if defaults else None},
        "before_after": [r for r in rows if r is not None],
        "config_written": written, "verification": verification.to_json() if verification else None,
        "conditions": _conditions(conditions), "environment": environment,
    }


def print_summary(report: dict, folder: Path) -> None:
    print(f"\n{report['model']} (SLO p99 <= {report['slo_ms']:g} ms)")
    print(f"  {'configuration':<40}{'batch':>6}{'delay':>7}{'w x t':>7}{'req/s':>9}  p99 ms")
    for row in report["before_after"]:
        print(f"  {row['label']:<40}{row['batch_size']:>6}{row['max_batch_delay_ms']:>7}"
              f"{row['workers']:>4} x{row['threads']:>2}{row['throughput_rps']:>9.1f}  {_tail(row)}")
    print(f"  {report['verdict']}")
    print(f"  report: {folder / 'report.md'}")


def _f(value: Optional[float], digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _tail(point: Optional[dict], label: bool = False) -> str:
    """A point's p99 as a table cell (label False) or in a sentence, by stats.tail_text's rule;
    points measured before the sample count was recorded say so."""
    if not point:
        return "-"
    latency = {"count": point.get("samples"), "p90_ms": point.get("p90_ms"), "p99_ms": point.get("p99_ms")}
    return stats.tail_text(latency) if label else stats.tail_cell(latency)


def write_csv(path: Path, report: dict) -> None:
    slo = report["slo_ms"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for result in report.get("search") or []:  # the defaults first, when measured
            for p in result["points"]:
                passed = Point.from_json(p).passes(slo)
                writer.writerow({"phase": result["phase"], "candidate": result["key"], **result["candidate"],
                                 **{k: p[k] for k in CSV_FIELDS if k in p}, "passed": passed})
        for p in (report.get("verification") or {}).get("points", []):
            writer.writerow({"phase": "verification", "candidate": p["candidate"],
                             **{k: p[k] for k in CSV_FIELDS if k in p}})


def _candidate_table(results: list[dict], chosen_key: Optional[str], with_prediction: bool) -> list[str]:
    head = ("#", "candidate", "workers x threads", "batch", "delay ms",
            *(("predicted req/s", "start req/s") if with_prediction else ()),
            "req/s within SLO", "p99 ms there", "mean batch", "points", "seconds")
    rows = []
    for index, r in enumerate(results, 1):
        c, best, pred = r["candidate"], r["best"] or {}, r.get("prediction") or {}
        mark = " **(chosen)**" if r["key"] == chosen_key else ""
        rows.append((index, f"`{r['key']}`{mark}", f"{c['workers']} x {c['threads']}", c["batch_size"],
                     c["max_batch_delay_ms"], *((_f(pred.get("rate_rps")), _f(r["start_rps"])) if with_prediction else ()),
                     _f(r["throughput_rps"]), _tail(best), _f(best.get("mean_batch"), 2), len(r["points"]),
                     _f(r["seconds"], 0)))
    return cli.table(head, rows)


def ray_lines(ray: Optional[dict]) -> list[str]:
    """tune-ray's file for Ray Serve: what went into it and how serving it went."""
    if not ray:
        return []
    chosen, verified = ray["chosen"], ray["verification"]
    answers = ", ".join(f"{model} answered {a['status']}" for model, a in verified["answers"].items()) or "no answer"
    return ["## Written for Ray Serve", "",
            f"Written into `{ray['written']}`: {chosen['workers']} replicas x {chosen['threads']} CPU, max_batch_size "
            f"{chosen['batch_size']}, batch_wait_timeout_s {chosen['max_batch_delay_ms'] / 1000:g}. Verified by serving "
            f"that file behind {ray['ingress']}: {answers}, ready in {_f(verified.get('ready_s'))} s: "
            f"{'passed' if verified['passed'] else 'FAILED'}.", ""]


def markdown(report: dict) -> str:
    model, slo = report["model"], report["slo_ms"]
    chosen = report.get("chosen") or {}
    lines = [f"# Tuning {model}: {report['started']}", ""]
    lines += [report.get("verdict", ""), ""]
    lines += ray_lines(report.get("ray"))
    before_after = report.get("before_after") or []
    if before_after:
        lines += ["## Before / after", "",
                  f"Open loop (Poisson arrivals), the highest rate whose p99 stays within {slo:g} ms at a stable "
                  f"point (an unstable one sets no capacity). A p99 over fewer than {stats.P99_MIN_SAMPLES:,} requests "
                  "is shown as the p90 and the count.", "",
                  *cli.table(("configuration", "batch", "delay ms", "workers x threads", "req/s within SLO", "p99 ms"),
                             [(row["label"], row["batch_size"], row["max_batch_delay_ms"],
                               f"{row['workers']} x {row['threads']}", _f(row["throughput_rps"]), _tail(row))
                              for row in before_after]), ""]
    search = report.get("search") or []
    if search:
        timing = report.get("timing", {})
        lines += ["## Measured candidates (model-guided search)", "",
                  f"{len(search)} of {report['space_size']} candidates measured; stop: {report.get('stop_reason')}. "
                  f"Measurement time: in-process fit {_f(timing.get('fit_s'), 0)} s + served "
                  f"{_f(timing.get('search_s'), 0)} s = {_f(timing.get('tuner_s'), 0)} s.", ""]
        lines += _candidate_table(search, chosen.get("key"), True) + [""]
    lines += variant_lines(report)
    fit = report.get("fit") or {}
    if fit:
        lines += ["## Service model", "", "In-process batch service times s(b), fitted as a + c*b; served, a "
                  "batch of b takes s(b) + o_batch + o_request*b, the overheads fitted per worker count to what the "
                  "servers sustained.", "",
                  *cli.table(("threads", "measured s(b) ms", "a ms", "c ms/item"), [
                      (threads, ", ".join(f"b{p['batch_size']}: {p['service_ms']:.1f}" for p in fit["points"]
                                          if str(p["threads"]) == threads), f"{coef['a_ms']:.2f}", f"{coef['c_ms']:.2f}")
                      for threads, coef in fit["model"]["service_ms_by_threads"].items()])]
        served = (report.get("calibrated_model") or {}).get("served_overhead_by_workers") or {}
        if served:
            lines += ["", "Served overhead after the search: " + "; ".join(
                f"{w} worker(s): {o['per_batch_ms']:.1f} ms per batch + {o['per_request_ms']:.1f} ms per request"
                for w, o in served.items()) + "."]
        first = report.get("first_predictions") or []
        if first:
            lines += ["", "The model's first ranking (in-process fit only, before any served measurement):", "",
                      *cli.table(("rank", "candidate", "predicted req/s", "p99 ms", "mean batch", "capacity req/s"),
                                 [(i, f"`{p['key']}`", _f(p["rate_rps"]), _f(p["p99_ms"]), _f(p["mean_batch"], 2),
                                   _f(p["capacity_rps"])) for i, p in enumerate(first[:10], 1)])]
        lines.append("")
    verification = report.get("verification")
    if verification:
        lines += ["## Verification", "", f"Config: `{verification['config']}`; GET /models/{model}: "
                  + ", ".join(f"{k} {v}" for k, v in verification["described"].items())
                  + f"; worker threads {verification['worker_threads']}. Result: {verification['summary']}.", ""]
        for p in verification["points"]:
            lines.append(f"- {p['rate_rps']:.1f} req/s offered: {p['achieved_rps']:.1f} served, "
                         f"{_tail(p, label=True)}, {p['errors']} errors"
                         + ("" if p.get("stable", True) else ", unstable (sets no capacity)"))
        lines.append("")
    written = report.get("config_written")
    if written:
        lines += ["## Written", "", f"`{written['path']}`, models= stanza for {model}:", "", "```",
                  written["stanza"].rstrip(), "```", ""]
    conditions = report.get("conditions") or {}
    if conditions:
        lines += ["## Conditions", "", conditions.get("note", ""), "",
                  f"Load average before {conditions['before']['load_average']}, after "
                  f"{conditions['after']['load_average']}; other TorchServe pids before "
                  f"{conditions['before']['other_torchserve_pids'] or 'none'}, after "
                  f"{conditions['after']['other_torchserve_pids'] or 'none'}; at each server start the highest "
                  f"1-minute load average was {conditions.get('max_load_at_starts', '-')}, with other TorchServe "
                  f"servers up at {conditions.get('starts_with_others', 0)} of {conditions.get('starts', 0)} starts.",
                  ""]
    env = report.get("environment") or {}
    lines += ["## Reproduce", "", f"```\n{report['command']}\n```", "",
              f"Machine: {env.get('cpu')}, {env.get('physical_cores')} cores, torch {env.get('torch')}, "
              f"torchserve {env.get('torchserve')}, git {env.get('git_commit')}.", ""]
    return "\n".join(lines)


def plot(path: Path, report: dict) -> None:
    """Every measured point on throughput vs p99, one colour per candidate; each candidate's best
    point within the SLO circled, the chosen one starred."""
    slo = report["slo_ms"]
    chosen = (report.get("chosen") or {}).get("key")
    with cli.figure(path, figsize=(8, 5)) as ax:
        import matplotlib

        colours = matplotlib.colormaps["tab10"]
        for index, r in enumerate(report.get("search") or []):
            pts = sorted((p for p in r["points"] if p["p99_ms"] is not None), key=lambda p: p["achieved_rps"])
            colour = "#444444" if r["phase"] == "defaults" else colours(index % 10)
            label = ("TorchServe defaults " if r["phase"] == "defaults" else "") + r["key"]
            ax.plot([p["achieved_rps"] for p in pts], [p["p99_ms"] for p in pts], "o", ms=5, color=colour, label=label)
            if r["best"]:
                marker, size = ("*", 260) if r["key"] == chosen and r["phase"] == "search" else ("o", 90)
                ax.scatter([r["best"]["achieved_rps"]], [r["best"]["p99_ms"]], marker=marker, s=size,
                           facecolors="none" if marker == "o" else colour, edgecolors=colour, zorder=5)
        ax.axhline(slo, color="red", ls="--", lw=1, label=f"SLO p99 {slo:g} ms")
        ax.set_yscale("log")
        ax.set_xlabel("served throughput, req/s (open loop)")
        ax.set_ylabel("p99 latency, ms (log)")
        ax.set_title(f"{report['model']}: measured candidates (star: chosen)")
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)


def write(folder: Path, report: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    write_csv(folder / "results.csv", report)
    (folder / "report.md").write_text(markdown(report), encoding="utf-8")
    plot(folder / "candidates.png", report)
    return folder


def variant_lines(report: dict) -> list:
    """Every variant's in-process rate and gate figure, and the one chosen (benchmarks/tune/variants.py)."""
    table = report.get("variants") or {}
    if not table:
        return []
    lines = ["## Variant", "",
             f"Chosen: **{report.get('variant')}** (the best capacity at the SLO predicted from each variant's "
             "in-process fit; the default kept unless another beats it by more than 10%: benchmarks/tune/variants.py). Only variants that "
             "passed the build's accuracy gate are candidates.", "",
             *cli.table(("variant", "accuracy gate", "in-process items/s (fewest threads)", "predicted req/s at the SLO",
                         "at"), [(name + (" (chosen)" if name == report.get("variant") else ""), row["gate"] or "not gated",
                                  ", ".join(f"b{b}: {v:.0f}" for b, v in row["items_per_s"].items()),
                                  f"{row['predicted']['rate_rps']:.1f}", row["predicted"]["candidate"])
                                 for name, row in table.items()])]
    return lines + [""]
