"""The tuner's report folder: report.json, results.csv, report.md and candidates.png.

report.json holds everything (inputs, every measured point, the fit, the choice, verification,
conditions on the machine); results.csv one row per open-loop point; report.md the tables a
reader wants: before/after, every measured candidate, and the grid comparison when one was run.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import List, Optional

CSV_FIELDS = ("phase", "candidate", "workers", "threads", "batch_size", "max_batch_delay_ms", "rate_rps",
              "offered_rps", "achieved_rps", "p50_ms", "p99_ms", "errors", "mean_batch", "passed", "seconds",
              "overhead_s", "others_cpu_pct")


def _f(value: Optional[float], digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _rows(report: dict) -> List[dict]:
    """Every candidate result in the report, with its phase."""
    out = []
    for phase in ("search", "grid"):  # the search's results start with the defaults, when measured
        value = report.get(phase)
        if value is None:
            continue
        out += value if isinstance(value, list) else [value]
    judged = (report.get("grid_comparison") or {}).get("head_to_head")
    return out + (judged["results"] if judged else [])


def write_csv(path: Path, report: dict) -> None:
    slo = report["slo_ms"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for result in _rows(report):
            for p in result["points"]:
                passed = (p["p99_ms"] is not None and p["p99_ms"] <= slo and p["errors"] == 0
                          and p["achieved_rps"] >= 0.95 * p["offered_rps"])
                writer.writerow({"phase": result["phase"], "candidate": result["key"], **result["candidate"],
                                 **{k: p[k] for k in CSV_FIELDS if k in p}, "passed": passed})
        for p in (report.get("verification") or {}).get("points", []):
            writer.writerow({"phase": "verification", "candidate": p["candidate"],
                             **{k: p[k] for k in CSV_FIELDS if k in p}})


def _candidate_table(results: List[dict], chosen_key: Optional[str], with_prediction: bool) -> List[str]:
    head = "| # | candidate | workers x threads | batch | delay ms |"
    head += " predicted req/s | start req/s |" if with_prediction else ""
    head += " req/s within SLO | p99 ms there | mean batch | points | seconds |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for index, r in enumerate(results, 1):
        c, best, pred = r["candidate"], r["best"] or {}, r.get("prediction") or {}
        mark = " **(chosen)**" if r["key"] == chosen_key else ""
        row = f"| {index} | `{r['key']}`{mark} | {c['workers']} x {c['threads']} | {c['batch_size']} | " \
              f"{c['max_batch_delay_ms']} |"
        if with_prediction:
            row += f" {_f(pred.get('rate_rps'))} | {_f(r['start_rps'])} |"
        row += (f" {_f(r['throughput_rps'])} | {_f(best.get('p99_ms'))} | {_f(best.get('mean_batch'), 2)} | "
                f"{len(r['points'])} | {_f(r['seconds'], 0)} |")
        lines.append(row)
    return lines


def markdown(report: dict) -> str:
    model, slo = report["model"], report["slo_ms"]
    chosen = report.get("chosen") or {}
    lines = [f"# Tuning {model}: {report['started']}", ""]
    lines += [report.get("verdict", ""), ""]
    before_after = report.get("before_after") or []
    if before_after:
        lines += ["## Before / after", "",
                  f"Open loop (Poisson arrivals), the highest rate whose p99 stays within {slo:g} ms.", "",
                  "| configuration | batch | delay ms | workers x threads | req/s within SLO | p99 ms |",
                  "|---|---|---|---|---|---|"]
        for row in before_after:
            lines.append(f"| {row['label']} | {row['batch_size']} | {row['max_batch_delay_ms']} | "
                         f"{row['workers']} x {row['threads']} | {_f(row['throughput_rps'])} | {_f(row['p99_ms'])} |")
        lines.append("")
    search = report.get("search") or []
    if search:
        timing = report.get("timing", {})
        lines += ["## Measured candidates (model-guided search)", "",
                  f"{len(search)} of {report['space_size']} candidates measured; stop: {report.get('stop_reason')}. "
                  f"Measurement time: in-process fit {_f(timing.get('fit_s'), 0)} s + served "
                  f"{_f(timing.get('search_s'), 0)} s = {_f(timing.get('tuner_s'), 0)} s.", ""]
        lines += _candidate_table(search, chosen.get("key"), True) + [""]
    fit = report.get("fit") or {}
    if fit:
        lines += ["## Service model", "", "In-process batch service times s(b), fitted as a + c*b; served, a "
                  "batch of b takes s(b) + o_batch + o_request*b, the overheads fitted per worker count to what the "
                  "servers sustained.", "",
                  "| threads | measured s(b) ms | a ms | c ms/item |", "|---|---|---|---|"]
        by_threads = fit["model"]["service_ms_by_threads"]
        for threads, coef in by_threads.items():
            pts = ", ".join(f"b{p['batch_size']}: {p['service_ms']:.1f}" for p in fit["points"]
                            if str(p["threads"]) == threads)
            lines.append(f"| {threads} | {pts} | {coef['a_ms']:.2f} | {coef['c_ms']:.2f} |")
        served = (report.get("calibrated_model") or {}).get("served_overhead_by_workers") or {}
        if served:
            lines += ["", "Served overhead after the search: " + "; ".join(
                f"{w} worker(s): {o['per_batch_ms']:.1f} ms per batch + {o['per_request_ms']:.1f} ms per request"
                for w, o in served.items()) + "."]
        first = report.get("first_predictions") or []
        if first:
            lines += ["", "The model's first ranking (in-process fit only, before any served measurement):", "",
                      "| rank | candidate | predicted req/s | p99 ms | mean batch | capacity req/s |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {i} | `{p['key']}` | {_f(p['rate_rps'])} | {_f(p['p99_ms'])} | {_f(p['mean_batch'], 2)} | "
                      f"{_f(p['capacity_rps'])} |" for i, p in enumerate(first[:10], 1)]
        lines.append("")
    comparison = report.get("grid_comparison")
    if comparison:
        lines += ["## Search efficiency against the exhaustive grid", "", comparison["sentence"], "",
                  "| | tuner | grid |", "|---|---|---|",
                  f"| candidates measured | {comparison['tuner_candidates']} | {comparison['grid_candidates']} |",
                  f"| open-loop points | {comparison['tuner_points']} | {comparison['grid_points']} |",
                  f"| measurement time, s | {comparison['tuner_s']:.0f} | {comparison['grid_s']:.0f} |",
                  f"| best req/s within SLO | {comparison['tuner_rps']:.1f} (`{comparison['tuner_key']}`) | "
                  f"{comparison['grid_rps']:.1f} (`{comparison['grid_key']}`) |", ""]
        judged = comparison.get("head_to_head")
        if judged:
            lines += ["### Head to head", "", "The pick and the grid's best measured again (not counted as "
                      "either side's time), alternating so a drift of the machine hits both alike:", ""]
            lines += _candidate_table(judged["results"], None, False) + [""]
        lines += ["### Grid: every candidate", ""]
        lines += _candidate_table(report["grid"], comparison["grid_key"], False) + [""]
    verification = report.get("verification")
    if verification:
        lines += ["## Verification", "", f"Config: `{verification['config']}`; GET /models/{model}: "
                  + ", ".join(f"{k} {v}" for k, v in verification["described"].items())
                  + f"; worker threads {verification['worker_threads']}. Result: {verification['summary']}.", ""]
        for p in verification["points"]:
            lines.append(f"- {p['rate_rps']:.1f} req/s offered: {p['achieved_rps']:.1f} served, p99 "
                         f"{_f(p['p99_ms'])} ms, {p['errors']} errors")
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
    point within the SLO circled, the chosen one starred; grid points in grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slo = report["slo_ms"]
    chosen = (report.get("chosen") or {}).get("key")
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in report.get("grid") or []:
        pts = [p for p in r["points"] if p["p99_ms"] is not None]
        ax.scatter([p["achieved_rps"] for p in pts], [p["p99_ms"] for p in pts], s=10, color="#bbbbbb",
                   label="grid points" if r is report["grid"][0] else None)
    colours = plt.get_cmap("tab10")
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(folder: Path, report: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    write_csv(folder / "results.csv", report)
    (folder / "report.md").write_text(markdown(report), encoding="utf-8")
    plot(folder / "candidates.png", report)
    return folder
