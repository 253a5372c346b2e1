"""The device check's report: report.json, report.md (agreement, speed by device, precision and
batch size, the targets, CUDA graphs, memory, what the budget left out) and throughput.png."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

# The targets the check is read against, per family (on one GPU against the same machine's CPU).
TARGETS = (
    # (family, what, batch size, at least)
    ("image_classifier", "handler cuda/cpu", 64, 10.0),
    ("image_classifier", "handler/bare on cuda", 64, 0.5),
    ("text_embedder", "handler cuda/cpu", 64, 5.0),
    ("causal_lm", "tokens/s cuda/cpu", None, 5.0),
)
GRAPHS_TARGET = 1.3


def _row(result: dict, device: str, size: Optional[int], precision: str = "fp32") -> Optional[dict]:
    """The row at this precision, else the device's first at this size (a serialised graph runs one)."""
    rows = [r for r in result["rows"] if r["device"] == device and (size is None or r["batch_size"] == size)]
    return next((r for r in rows if r["precision"] == precision), rows[0] if rows else None)


def target_rows(results: list[dict]) -> list[dict[str, Any]]:
    """Each target with its measured value, where the run measured both sides."""
    rows = []
    for family, what, size, floor in TARGETS:
        result = next((r for r in results if r["family"] == family), None)
        model = result["model"] if result else f"({family})"
        measured = None
        if result is not None:
            cpu, cuda = _row(result, "cpu", size), _row(result, "cuda", size)
            if what == "handler cuda/cpu" and cpu and cuda:
                measured = cuda["handler_items_per_s"] / cpu["handler_items_per_s"]
            elif what == "handler/bare on cuda" and cuda:
                measured = cuda["handler_items_per_s"] / cuda["bare_items_per_s"]
            elif what == "tokens/s cuda/cpu" and cpu and cuda:
                measured = cuda["tokens_per_s"] / cpu["tokens_per_s"]
        rows.append({"model": model, "what": what, "batch_size": size, "at_least": floor, "measured": measured,
                     "met": None if measured is None else measured >= floor})
    graphs = [r["graphs"]["speedup"] for r in results if r.get("graphs")]
    rows.append({"model": "any", "what": "CUDA graphs at batch 1", "batch_size": 1, "at_least": GRAPHS_TARGET,
                 "measured": max(graphs) if graphs else None,
                 "met": None if not graphs else max(graphs) >= GRAPHS_TARGET})
    return rows


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _tf32(row: dict) -> str:
    return "on" if row.get("tf32") else "off" if row.get("device") == "cuda" else "-"


def _runs(result: dict) -> str:
    return result.get("runs") or result.get("variant", "?")


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"# Device check ({report['created']})", "",
             f"`{report['command']}`", "",
             f"- devices: {', '.join(report['devices'])}; GPU: {report['gpu'] or 'none'}; CPU: {env['cpu']}, "
             f"{env['logical_cpus']} CPUs; torch {env['torch']}",
             f"- time budget {report['budget']['budget_s'] / 60:g} min, {report['budget']['spent_s'] / 60:.1f} min spent; "
             "not measured for want of time: " + ("; ".join(report["budget"]["left_out"]) or "nothing"), "",
             "## Agreement with the CPU's fp32 answers", "",
             "| model | runs | device | precision | TF32 | kind | worst | target | |",
             "|---|---|---|---|---|---|---|---|---|"]
    for result in report["results"]:
        for a in result["agreement"]:
            verdict = "reported" if a["passed"] is None else "ok" if a["passed"] else "**FAILS**"
            if a.get("problem") and a["passed"] is False:
                verdict += f": {a['problem']}"
            lines.append(f"| {result['model']} | {_runs(result)} | {a['device']} | {a['precision']} | "
                         f"{_tf32(a)} | {a['kind']} | {_fmt(a['worst'], 4)} | {a['target']} | {verdict} |")
    skipped = [(r["model"], why) for r in report["results"] for why in r.get("skipped", [])]
    if skipped:
        lines += ["", "## Not run (and why)", ""] + [f"- {model}: {why}" for model, why in skipped]
    failures = [(r["model"], e) for r in report["results"] for e in r.get("errors", [])]
    if failures:
        lines += ["", "## Failed (each cost its own rows only)", ""]
        lines += [f"- {model}: `{error}`" for model, error in failures]
    lines += ["", "## Speed", "", "items/s of the whole handler (decode, collate, forward, post-process) and of the "
              "bare forward on the same batch already on the device; a causal LM: tokens/s of its engine.", "",
              "| model | device | precision | TF32 | batch | handler | bare forward | handler / bare |",
              "|---|---|---|---|---|---|---|---|"]
    for result in report["results"]:
        for r in result["rows"]:
            if "tokens_per_s" in r:
                lines.append(f"| {result['model']} | {r['device']} | {r['precision']} | {_tf32(r)} | "
                             f"{r['batch_size']} streams | {_fmt(r['tokens_per_s'])} tokens/s | | |")
                continue
            lines.append(f"| {result['model']} | {r['device']} | {r['precision']} | {_tf32(r)} | {r['batch_size']} | "
                         f"{_fmt(r['handler_items_per_s'])} | {_fmt(r['bare_items_per_s'])} | "
                         f"{r['handler_items_per_s'] / r['bare_items_per_s']:.2f} |")
    lines += ["", "## Targets", "", "| model | what | batch | at least | measured | |", "|---|---|---|---|---|---|"]
    for t in report["targets"]:
        verdict = "not measured" if t["met"] is None else "met" if t["met"] else "**missed**"
        lines.append(f"| {t['model']} | {t['what']} | {t['batch_size'] or ''} | {t['at_least']}x | "
                     f"{_fmt(t['measured'], 2)} | {verdict} |")
    lines += ["", "## CUDA graphs and GPU memory", ""]
    for result in report["results"]:
        graphs = result.get("graphs")
        lines.append(f"- {result['model']}: CUDA graphs at batch 1 "
                     + (f"{graphs['off_items_per_s']:.1f} -> {graphs['on_items_per_s']:.1f} items/s "
                        f"({graphs['speedup']:.2f}x)" if graphs else "not measured")
                     + f"; peak GPU memory {_fmt(result.get('peak_gpu_mib'))} MiB"
                     + ("; random weights of the archive's architecture" if result.get("random_weights") else ""))
    lines += ["", "![throughput by batch size](throughput.png)", ""]
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [r for r in results if any("handler_items_per_s" in row for row in r["rows"])]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, result in zip(axes[0], panels):
        for device, precision in sorted({(r["device"], r["precision"]) for r in result["rows"]}):
            rows = sorted((r for r in result["rows"] if (r["device"], r["precision"]) == (device, precision)),
                          key=lambda r: r["batch_size"])
            sizes = [r["batch_size"] for r in rows]
            ax.plot(sizes, [r["handler_items_per_s"] for r in rows], marker="o", label=f"{device} {precision} handler")
            ax.plot(sizes, [r["bare_items_per_s"] for r in rows], linestyle="--", alpha=0.6,
                    label=f"{device} {precision} bare")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("items/s")
        ax.set_title(result["model"])
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(plan, results: list[dict], budget) -> Path:
    import torch

    from benchmarks.load.environment import describe_environment

    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = Path(plan.out) / f"device-check-{stamp}"
    folder.mkdir(parents=True, exist_ok=False)
    report = {"created": stamp, "command": plan.command, "devices": list(plan.devices),
              "gpu": torch.cuda.get_device_name(0) if "cuda" in plan.devices else None,
              "batch_sizes": list(plan.batch_sizes), "seconds": plan.seconds, "streams": plan.streams,
              "budget": budget.to_json(), "environment": describe_environment(),
              "results": results, "targets": target_rows(results)}
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "report.md").write_text(markdown(report))
    plot(results, folder / "throughput.png")
    return folder
