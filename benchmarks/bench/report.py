"""Write a benchmark's report folder: report.json, results.csv, report.md and the PNG plots.

benchmarks/reports/<model>-<YYYYmmdd-HHMMSS>/. The verdict compares ours with its two references,
both measured in the same run: the stock baseline (speedup = ours / stock) and the in-process
limit (serving efficiency = served / in-process items/s).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from benchmarks.load import cli, stats
from benchmarks.load.resources import NOISY_OTHERS_PCT
from benchmarks.load.runner import ServerRun, summary

CSV_COLUMNS = (
    "server", "mode", "level", "stable", "windows", "seconds", "requests", "ok", "errors", "unanswered", "nominal_rps",
    "offered_rps", "throughput_rps", "mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "max_ms",
    "late_fraction", "queue_ms", "frontend_ms", "mean_batch_size", "handler_ms_per_batch", "preprocess_ms",
    "inference_ms", "postprocess_ms", "frontend_cpu_pct", "workers_cpu_pct", "generator_cpu_pct",
    "others_cpu_pct", "frontend_rss_mb", "workers_rss_mb",
)


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None


def low_load(run: ServerRun) -> dict:
    """The tail at low load: the open-loop point at the lowest rate (after a capacity search, the one at
    a share of that capacity)."""
    opened = [p.figures for p in run.points
              if p.figures["mode"] == "open" and p.figures["latency_ms"] and not p.figures.get("scout")]
    f = min(opened, key=lambda f: f["level"], default=None)
    latency = (f or {}).get("latency_ms") or {}
    return {"low_load_rps": f["throughput_rps"] if f else None, "low_load_p99_ms": latency.get("p99_ms"),
            "low_load_p90_ms": latency.get("p90_ms"), "low_load_samples": latency.get("count")}


def summarize(runs: Mapping[str, ServerRun], inprocess: dict, slo_ms: float) -> dict:
    ours = {**summary(runs["ours"], slo_ms), **low_load(runs["ours"])}
    stock = summary(runs["stock"], slo_ms) if "stock" in runs else None
    limit = inprocess["items_per_s"]
    out = {
        "slo_ms": slo_ms,
        "inprocess_items_per_s": limit,
        "ours": ours,
        "stock": stock,
        "speedup_at_peak": _ratio(ours["peak_rps"], stock and stock["peak_rps"]),
        "speedup_at_slo": _ratio(ours["slo_rps"], stock and stock["slo_rps"]),
        "efficiency_at_peak": _ratio(ours["peak_rps"], limit),
        "efficiency_at_slo": _ratio(ours["slo_rps"], limit),
        # Other archives of the same model (--compare-variant) under the same settings and load.
        "variants": {label: {**summary(run, slo_ms), **low_load(run)} for label, run in runs.items()
                     if label not in ("ours", "stock")},
    }
    out["sentences"] = sentences(out)
    out["verdict"] = out["sentences"][0]
    return out


def _x(value: Optional[float]) -> str:
    return f"{value:.1f}x" if value else "n/a"


def _pct(value: Optional[float]) -> str:
    return f"{value:.0%}" if value else "n/a"


def _at(figures: Optional[dict], point: str) -> dict:
    """A server summary's latency at its "peak" or "slo" point, as stats.tail_text reads it."""
    f = figures or {}
    return {"count": f.get(f"{point}_samples"), "p90_ms": f.get(f"{point}_p90_ms"), "p99_ms": f.get(f"{point}_p99_ms")}


def sentences(s: dict) -> list[str]:
    """The verdict at the p99 target, then the peak comparison."""
    ours, stock, slo = s["ours"], s["stock"], s["slo_ms"]
    if ours["slo_rps"]:
        verdict = f"At p99 <= {slo:g} ms (open loop) ours serves {ours['slo_rps']:.1f} req/s"
        if stock is None:
            verdict += " (no stock baseline measured)"
        elif stock["slo_rps"]:
            verdict += f", {s['speedup_at_slo']:.1f}x the stock baseline ({stock['slo_rps']:.1f} req/s)"
        else:
            verdict += ", while the stock baseline meets that p99 at none of its measured open-loop rates"
        verdict += f", at {s['efficiency_at_slo']:.0%} of the in-process limit ({s['inprocess_items_per_s']:.1f} items/s)."
    else:
        verdict = f"Ours meets p99 <= {slo:g} ms at none of the measured open-loop rates."
    if ours["peak_rps"] is None:  # no closed-loop sweep (the short default): no peak to state
        peak = "No closed-loop sweep in this run, so no peak (`--full` measures one)"
    else:
        peak = (f"At peak (closed loop) ours serves {_fmt(ours['peak_rps'])} req/s "
                f"({stats.tail_text(_at(ours, 'peak'), 0)}, {ours['peak_point']}), "
                f"{_pct(s['efficiency_at_peak'])} of the in-process limit")
    if stock and stock["peak_rps"] is not None and ours["peak_rps"] is not None:
        peak += (f"; the stock baseline peaks at {_fmt(stock['peak_rps'])} req/s "
                 f"({stats.tail_text(_at(stock, 'peak'), 0)}): {_x(s['speedup_at_peak'])}")
    compared = [f"Same settings and load, {label}: {_fmt(v['slo_rps'])} req/s at p99 <= {slo:g} ms (ours "
                f"{_ratio(ours['slo_rps'], v['slo_rps']) or 0:.2f}x that)"
                + (f", closed-loop peak {_fmt(v['peak_rps'])} req/s" if v["peak_rps"] is not None else "")
                + _low_load_text(v, ours) + "."
                for label, v in (s.get("variants") or {}).items()]
    return [verdict, peak + ".", *compared]


def _low_load_text(one: dict, ours: dict) -> str:
    """", at low load p99 X ms at R req/s (ours: ...)" where both runs have a low-load point."""
    if one.get("low_load_rps") is None or ours.get("low_load_rps") is None:
        return ""
    return (f", at low load {stats.tail_text(_at(one, 'low_load'), 1)} at {_fmt(one['low_load_rps'])} req/s "
            f"(ours {stats.tail_text(_at(ours, 'low_load'), 1)} at {_fmt(ours['low_load_rps'])} req/s)")


def csv_row(server: str, f: dict) -> dict[str, object]:
    lat = f["latency_ms"] or {}
    srv = f["server"]
    res = f["resources"]
    stages = srv["stage_ms_per_batch"]
    return {
        "server": server, "mode": f["mode"], "level": f["level"], "stable": f["stable"], "windows": f["windows"],
        "seconds": round(f["seconds"], 2), "requests": f["requests"], "ok": f["ok"],
        "errors": sum(f["errors"].values()), "unanswered": f["unanswered"], "nominal_rps": f["nominal_rps"],
        "offered_rps": f["offered_rps"],
        "throughput_rps": f["throughput_rps"], "mean_ms": lat.get("mean_ms"), "p50_ms": lat.get("p50_ms"),
        "p90_ms": lat.get("p90_ms"), "p95_ms": lat.get("p95_ms"), "p99_ms": lat.get("p99_ms"),
        "p999_ms": lat.get("p999_ms"), "max_ms": lat.get("max_ms"), "late_fraction": f["late_fraction"],
        "queue_ms": srv["queue_ms_per_request"], "frontend_ms": srv["frontend_ms_per_request"],
        "mean_batch_size": srv["mean_batch_size"], "handler_ms_per_batch": srv["handler_ms_per_batch"],
        "preprocess_ms": stages.get("preprocess"), "inference_ms": stages.get("inference"),
        "postprocess_ms": stages.get("postprocess"),
        "frontend_cpu_pct": res["frontend"]["cpu_pct"], "workers_cpu_pct": res["workers"]["cpu_pct"],
        "generator_cpu_pct": res["generator"]["cpu_pct"], "others_cpu_pct": res["others"]["cpu_pct"],
        "frontend_rss_mb": res["frontend"]["rss_mb"],
        "workers_rss_mb": res["workers"]["rss_mb"],
    }


def _fmt(value: object, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(report: dict) -> str:
    s, cfg, env = report["summary"], report["configuration"], report["environment"]
    cond = report["conditions"]
    remeasured = sum(1 for run in report["results"].values() for f in run["points"] if f["remeasured"])
    lines = [f"# {report['model']}: ours vs the stock baseline vs the in-process limit", "",
             f"**{s['sentences'][0]}**", ""] + [line for extra in s["sentences"][1:] for line in (extra, "")]
    ours = cfg["ours"]
    lines += ["## Configuration", "",
              f"- ours: batch size {ours['batch_size']}, max batch delay {ours['max_batch_delay_ms']} ms, "
              f"{ours['max_workers']} worker(s) x {ours['threads_resolved']} threads "
              f"(logged by the workers: {report['results']['ours']['worker_threads']}), shipped archive settings",
              (f"- stock: {cfg['stock']['handler']}; TorchServe defaults "
               f"(batch size {report['results']['stock']['frontend']['batchSize']}, "
               f"{report['results']['stock']['frontend']['workers']} workers x "
               f"{report['results']['stock']['worker_threads']} torch threads)" if "stock" in report["results"]
               else f"- stock: none ({cfg['stock'].get('missing') or 'not measured'}); ours is compared with "
                    "the in-process limit only"),
              f"- in-process limit: the same handler without a server, batch {report['reference']['inprocess']['batch_size']}, "
              f"{report['reference']['inprocess']['threads']} threads, x {report['reference']['inprocess'].get('workers', 1)} "
              f"worker(s): {report['reference']['inprocess']['items_per_s']:.1f} items/s"
              f" (other processes meanwhile: {report['reference']['inprocess'].get('others_cpu_pct', 0):.0f}% of a core)",
              f"- p99 target: {s['slo_ms']:g} ms", ""]
    lines += ["## Summary", "", *cli.table(("", "ours", "stock", "in-process"), [
        ("peak req/s", _fmt(s["ours"]["peak_rps"]), _fmt((s["stock"] or {}).get("peak_rps")),
         f"{s['inprocess_items_per_s']:.1f}"),
        ("p99 at peak (ms)", stats.tail_cell(_at(s["ours"], "peak"), 0),
         stats.tail_cell(_at(s["stock"], "peak"), 0) if s["stock"] else "-", ""),
        (f"req/s at p99 <= {s['slo_ms']:g} ms (open loop)", _fmt(s["ours"]["slo_rps"]),
         _fmt((s["stock"] or {}).get("slo_rps")), ""),
        ("speedup over stock (peak / at target)", f"{_x(s['speedup_at_peak'])} / {_x(s['speedup_at_slo'])}", "", ""),
        ("share of the in-process limit (peak / at target)",
         f"{_pct(s['efficiency_at_peak'])} / {_pct(s['efficiency_at_slo'])}", "", "")]), ""]
    for server, run in report["results"].items():
        rows = []
        for f in run["points"]:
            r = csv_row(server, f)
            level = f"c={f['level']:g}" if f["mode"] == "closed" else f"{f['level']:g}/s"
            mode = "scout" if f.get("scout") else f["mode"]
            errors = f"{r['errors']} (+{r['unanswered']} cut)" if r["unanswered"] else str(r["errors"])
            latency = f["latency_ms"]
            spread = [v for v in f.get("window_p99_ms", ()) if v is not None]
            # Each window's own p99 only where each rests on enough answers (older reports: never).
            thick = len(f.get("window_ok", ())) == len(spread) and all(
                stats.supports(99.0, n) for n in f.get("window_ok", ()))
            p99 = stats.tail_cell(latency, 0) + (
                f" ({min(spread):.0f}-{max(spread):.0f})" if len(spread) > 1 and thick else "")
            p999 = _fmt(r["p999_ms"], 0) if latency and stats.supports(99.9, latency["count"]) else "-"
            rows.append((mode, level, _fmt(r["offered_rps"]), _fmt(r["throughput_rps"]), _fmt(r["p50_ms"], 0),
                         _fmt(r["p90_ms"], 0), p99, p999, _fmt(r["max_ms"], 0), errors, _fmt(r["queue_ms"]),
                         _fmt(r["mean_batch_size"]), _fmt(r["handler_ms_per_batch"]),
                         f"{r['frontend_cpu_pct']:.0f}/{r['workers_cpu_pct']:.0f}/{r['generator_cpu_pct']:.0f}/"
                         f"{r['others_cpu_pct']:.0f}", "yes" if f["stable"] else "no"))
        lines += [f"## Points: {server}", "", *cli.table(
            ("mode", "level", "offered", "req/s", "p50", "p90", "p99", "p99.9", "max", "err", "queue", "batch",
             "handler/batch", "CPU fe/wk/gen/other %", "stable"), rows), ""]
    lines += ["Each point: its last stable-rule windows; open loop, every request scheduled in them, answered "
              "or not (one never answered counts the time it was waited for); closed loop, the requests answered "
              "in them. Latencies in ms, from the intended send time; a p99 over fewer than "
              f"{stats.P99_MIN_SAMPLES:,} requests is shown as the p90 and the count, a p99.9 over fewer than "
              f"{10 * stats.P99_MIN_SAMPLES:,} not at all; p99 in brackets: the lowest and highest p99 of those "
              f"windows taken alone (the point's spread), where each held {stats.P99_MIN_SAMPLES:,} answers; "
              "offered = Poisson arrivals scheduled per second; err = failed answers "
              "(+ requests still unanswered when the point's drain time ran out); "
              "queue = TorchServe's queue time per request; "
              "batch = mean batch size formed; CPU in % of one core (frontend JVM / workers / load generator / "
              "every other process on the machine); stable = the stability rule held (a point that is not "
              "stable sets no capacity); scout = a short open-loop point that brackets the p99 target for the "
              "search and sets no capacity.", ""]
    if report["warnings"]:
        lines += ["## Warnings", ""] + [f"- {w}" for w in report["warnings"]] + [""]
    lines += ["## Plots", "", "![throughput vs p99](throughput_vs_p99.png)", "",
              "![latency CDF](latency_cdf.png)", "", "![batch sizes](batch_sizes.png)", "",
              "## Conditions and environment", "",
              f"- {env['cpu']}, {env['physical_cores']} cores / {env['logical_cpus']} CPUs, {env['memory_gib']} GiB; "
              f"torch {env['torch']}, TorchServe {env['torchserve']}, Python {env['python']}; commit {env['git_commit']}",
              f"- load average before {cond['before']['load_average']}, after {cond['after']['load_average']}; "
              f"other TorchServe frontends before {cond['before']['other_torchserve_pids'] or 'none'}, "
              f"after {cond['after']['other_torchserve_pids'] or 'none'}; run took {cond['seconds']} s",
              "- waits for a quiet machine: " + (", ".join(f"{phase} {w['waited_s']:.0f} s ({'quiet' if w['quiet'] else 'busy'})"
                                                         for phase, w in cond["waits"].items()) or "none asked")
              + f"; points measured again because other processes were busy: {remeasured}",
              _budget_line(cond.get("budget")),
              "- client and servers share the same 2 cores: the generator's own CPU is in the table", "",
              "Reproduce:", "", "```", report["command"], "```", ""]
    return "\n".join(lines)


def with_budget(overview: dict, ours: ServerRun, budget: Optional[dict], slo_ms: float) -> None:
    """When the time budget ended the run: a sentence naming what was not measured, and, if no
    full-length point was, a verdict that says so (with what the scouts saw) instead of a miss."""
    left_out = (budget or {}).get("left_out") or []
    if not left_out:
        return
    minutes = f"{budget['budget_s'] / 60:g} min"
    if not overview["ours"]["slo_rps"]:
        overview["sentences"][0] = (f"No capacity at p99 <= {slo_ms:g} ms: the time budget ({minutes}) ended the "
                                    f"run before a full-length point. {_scouts_text(ours, slo_ms)}")
        overview["verdict"] = overview["sentences"][0]
    overview["sentences"].append(f"The time budget ({minutes}) ended the run: not measured: "
                                 + "; ".join(left_out) + ".")


def _scouts_text(run: ServerRun, slo_ms: float) -> str:
    """What the scouts of a search cut short bracketed (no capacity: a scout sets none)."""
    scouts = [p.figures for p in run.points if p.figures.get("scout") and p.figures["latency_ms"]]
    within = [f["throughput_rps"] for f in scouts if (f["latency_ms"].get("p99_ms") or 0) <= slo_ms]
    over = [f["level"] for f in scouts if (f["latency_ms"].get("p99_ms") or 0) > slo_ms]
    if not scouts:
        return "No scout was measured either."
    if not within:
        return f"Its scouts (300 arrivals each) were over the target at every rate measured, the lowest {min(over):g} req/s."
    return (f"Its scouts (300 arrivals each) were within the target up to {max(within):.1f} req/s"
            + (f" and over it from {min(over):g} req/s" if over else "") + ".")


def _budget_line(budget: Optional[dict]) -> str:
    if not budget or budget.get("budget_s") is None:
        return "- time budget: none"
    left_out = "; ".join(budget["left_out"]) or "nothing"
    return (f"- time budget {budget['budget_s'] / 60:g} min, {budget['spent_s'] / 60:.1f} min spent on the servers' "
            f"points; not measured for want of time: {left_out}")


def write(out_root: Path, model: str, *, configuration: dict, load: dict, runs: Mapping[str, ServerRun],
          inprocess: dict, conditions: dict, command: str, slo_ms: float, smoke: bool = False,
          ceiling: Optional[Mapping[int, ServerRun]] = None) -> Path:
    from benchmarks.bench import plots, served_path, targets
    from benchmarks.load.environment import describe_environment

    stamp = cli.stamp()
    folder = cli.report_folder(out_root, model + ("-smoke" if smoke else ""), when=stamp)
    folder.mkdir(parents=True, exist_ok=False)
    results = {
        label: {"frontend": run.description, "worker_threads": list(run.worker_threads),
                "points": [p.figures for p in run.points]}
        for label, run in runs.items()
    }
    warnings = [f"{label} {p.figures['mode']} {p.figures['level']:g}: {w}"
                for label, run in runs.items() for p in run.points for w in p.figures["warnings"]]
    noisy = [(label, p.figures) for label, run in runs.items() for p in run.points
             if p.figures["resources"]["others"]["cpu_pct"] > NOISY_OTHERS_PCT]
    if inprocess.get("others_cpu_pct", 0.0) > NOISY_OTHERS_PCT:
        warnings.append(f"other processes used {inprocess['others_cpu_pct']:.0f}% of a core during the in-process "
                        "limit: it is pessimistic, and the efficiency figures optimistic")
    if noisy:
        worst = max(f["resources"]["others"]["cpu_pct"] for _, f in noisy)
        warnings.append(f"{len(noisy)} point(s) ran while other processes used > {NOISY_OTHERS_PCT:.0f}% of a core "
                        f"(up to {worst:.0f}%): those numbers are pessimistic")
    if conditions["before"]["other_torchserve_pids"] or conditions["after"]["other_torchserve_pids"]:
        warnings.append("other TorchServe servers were running on this machine: numbers are noisy")
    overview = summarize(runs, inprocess, slo_ms)
    with_budget(overview, runs["ours"], conditions.get("budget"), slo_ms)
    batch_size = configuration["ours"]["batch_size"]
    path = (served_path.summarize(runs["ours"], ceiling, inprocess["items_per_s"], batch_size,
                                  overview["ours"]["slo_rps"]) if ceiling else None)
    if path:
        overview["sentences"].append(served_path.sentence(path, batch_size, inprocess["items_per_s"]))
    goals = targets.check(runs["ours"], overview, inprocess, path)
    report = {
        "model": model, "created": stamp, "command": command, "configuration": configuration, "load": load,
        "summary": overview, "targets": goals, "results": results, "served_path": path,
        "ceiling": {str(size): [p.figures for p in run.points] for size, run in (ceiling or {}).items()},
        "reference": {"inprocess": inprocess, "stock": overview["stock"]},
        "conditions": conditions, "environment": describe_environment(),
        "warnings": warnings,
    }
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    with open(folder / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for label, run in runs.items():
            for p in run.points:
                writer.writerow(csv_row(label, p.figures))
    plots.write_all(folder, runs, report["summary"])
    text = markdown(report)
    # After the summary table, before the points.
    sections = (targets.markdown(goals) if goals else []) + (
        served_path.markdown(path, batch_size, inprocess["items_per_s"]) if path else [])
    if sections:
        text = text.replace("## Points: ours", "\n".join(sections) + "\n## Points: ours", 1)
    (folder / "report.md").write_text(text)
    return folder
