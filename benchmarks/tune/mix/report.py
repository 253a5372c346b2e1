"""The mix tuner's report: report.json (everything), report.md (the tables) and mix.png (capacity
per candidate; each model's p99 against the total rate, tuned vs the values before)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from benchmarks.load import cli, stats
from benchmarks.tune.mix.measure import Capacity
from benchmarks.tune.mix.search import Tried
from serving.mix_record import MixRecord
from serving.ts_config import ModelSettings

PER_MODEL = ("model", "req/s", "p99 (ms)", "SLO (ms)")
TARGET_RATIO = 1.5  # tuned capacity in the mix >= 1.5x the values before (each model tuned alone)


def build(options, alone: dict[str, tuple[ModelSettings, Optional[float]]], tried: Sequence[Tried], chosen: Tried,
          reference: Capacity, verified: Capacity, record: MixRecord, environment: dict,
          rejected: Optional[Tried] = None) -> dict:
    """`rejected`: the search's choice, when it measured below the values before and those were kept."""
    ratio = verified.rate_rps / reference.rate_rps if reference.rate_rps else None
    return {
        "options": options.to_json(),
        "environment": environment,
        "alone": {n: {"values": s.to_json(), "recorded_capacity_rps": cap} for n, (s, cap) in alone.items()},
        "search": [{"move": t.move, "plan": t.plan.to_json(), "capacity": t.capacity.to_json()} for t in tried],
        "chosen": chosen.plan.to_json(),
        "rejected": None if rejected is None else {"plan": rejected.plan.to_json(),
                                                   "capacity": rejected.capacity.to_json()},
        "reference": reference.to_json(),
        "verified": verified.to_json(),
        "ratio": ratio,
        "unchanged": record.unchanged,  # the written values are the ones before: two measurements of the same
        "target": {"ratio": TARGET_RATIO,
                   "met": ratio is not None and ratio >= TARGET_RATIO and not record.unchanged},
        "record": record.to_json(),
    }


def _per_model_rows(content: dict, key: str) -> list:
    """The body of a per-model table (model, req/s, p99, SLO) at `key`'s capacity point."""
    best, slo = content[key]["best"], content["options"]["mix"]["slo_ms"]
    rows = [(n, f"{f['achieved_rps']:.1f}", stats.tail_cell(f["latency_ms"]), f"{slo[n]:g}")
            for n, f in best["models"].items()] if best else [("(no rate passed)", "", "", "")]
    return cli.table(PER_MODEL, rows)[2:]


def _capacity_lines(content: dict) -> list[str]:
    """The capacity table (before, written, and the search's choice when it was rejected) and why."""
    ref, ver, rejected = content["reference"], content["verified"], content.get("rejected")
    rows = [("config.properties before", f"{ref['capacity_rps']:.1f}", f"{ref['memory_mib']:.0f}"),
            (f"{'kept' if rejected else 'the same values' if content.get('unchanged') else 'tuned for the mix'} "
             "(from the written file)", f"{ver['capacity_rps']:.1f}",
             f"{ver['memory_mib']:.0f}")]
    if rejected:
        plan = "; ".join(f"{n}: {c['workers']} x {c['threads']} thread(s), batch {c['batch_size']}, delay "
                         f"{c['max_batch_delay_ms']} ms" for n, c in rejected["plan"].items())
        rows.append((f"the search's choice ({plan}), from the written file",
                     f"{rejected['capacity']['capacity_rps']:.1f}", f"{rejected['capacity']['memory_mib']:.0f}"))
    lines = cli.table(("server", "total req/s within every SLO", "memory (MiB)"), rows)
    return lines + (["", "The search's choice served less than the values before, measured in the same run with the "
                     "long points: the tuner wrote the values before back (idle models at one worker of one thread) "
                     "and measured them again from the written file (the 'kept' row)."] if rejected else [])


def _ratio_line(content: dict) -> str:
    ratio, met = content["ratio"], "met" if content["target"]["met"] else "missed"
    shown = "-" if ratio is None else f"{ratio:.2f}x"
    if content.get("unchanged") and not content.get("rejected"):
        return (f"The search's best was the values the file had before, so both rows measure the same values in "
                f"the same run: their ratio ({shown}) is this host's spread between two measurements, not a gain "
                f"(target >= {TARGET_RATIO}x: {met}).")
    return f"Ratio: **{shown}** (target >= {TARGET_RATIO}x: {met})."


def markdown(content: dict) -> str:
    o = content["options"]
    lines = [
        "# Tuned for a traffic mix",
        "",
        f"Mix: {', '.join(f'{n} {s:.0%}' for n, s in o['mix']['shares'].items())}; core budget {o['cores']} "
        "(sum of workers x threads over the mix's models). Command: `" + o["command"] + "`.",
        "",
        "## Capacity in the mix (same run, same points)",
        "",
        *_capacity_lines(content),
        "",
        _ratio_line(content),
        "",
        "### Each model at the tuned capacity point",
        "",
        *cli.table(PER_MODEL, ()),
        *_per_model_rows(content, "verified"),
        "",
        "### Each model at the capacity point of config.properties before",
        "",
        *cli.table(PER_MODEL, ()),
        *_per_model_rows(content, "reference"),
        "",
        "### What each model gets alone (its own tuning, recorded in config.properties before)",
        "",
        *cli.table(("model", "values alone", "capacity alone (req/s)", "in the tuned mix"), [
            (name, f"{a['values']['minWorkers']} workers, batch {a['values']['batchSize']}, delay "
                   f"{a['values']['maxBatchDelay']} ms",
             "-" if a["recorded_capacity_rps"] is None else f"{a['recorded_capacity_rps']:.1f}",
             f"{c['workers']} x {c['threads']} thread(s), batch {c['batch_size']}, delay {c['max_batch_delay_ms']} ms")
            for name, a in content["alone"].items() for c in (content["chosen"][name],)]),
        "", "## The search (a whole server per candidate, every model loaded)", "",
        *cli.table(("#", "move", "capacity (req/s)"),
                   [(i, t["move"], f"{t['capacity']['capacity_rps']:.1f}") for i, t in enumerate(content["search"], 1)]),
        "", "![capacity and p99 per model](mix.png)", "",
    ]
    return "\n".join(lines)


def plot(content: dict, path: Path) -> None:
    names = list(content["options"]["mix"]["shares"])
    with cli.figure(path, 1, 1 + len(names), figsize=(5 + 4.5 * len(names), 4)) as axes:
        labels = [f"c{i}" for i in range(1, len(content["search"]) + 1)] + ["alone values", "tuned"]
        values = [t["capacity"]["capacity_rps"] for t in content["search"]]
        values += [content["reference"]["capacity_rps"], content["verified"]["capacity_rps"]]
        axes[0].bar(labels, values, color=["#999"] * len(content["search"]) + ["#d62728", "#2ca02c"])
        axes[0].set_ylabel("total req/s within every SLO")
        axes[0].set_title("capacity in the mix")
        axes[0].tick_params(axis="x", labelrotation=30)
        slo = content["options"]["mix"]["slo_ms"]
        for ax, name in zip(axes[1:], names):
            for key, colour, label in (("reference", "#d62728", "alone values"), ("verified", "#2ca02c", "tuned")):
                points = sorted(content[key]["points"], key=lambda p: p["offered_rps"])
                xs = [p["offered_rps"] for p in points if p["models"][name]["latency_ms"]]
                ys = [p["models"][name]["latency_ms"]["p99_ms"] for p in points if p["models"][name]["latency_ms"]]
                ax.plot(xs, ys, "o-", color=colour, label=label)
            ax.axhline(slo[name], color="k", linestyle="--", linewidth=1, label="SLO")
            ax.set_yscale("log")
            ax.set_xlabel("total offered req/s")
            ax.set_ylabel("p99 (ms)")
            ax.set_title(name)
            ax.legend()


def write(folder: Path, content: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(content, indent=1, default=str), encoding="utf-8")
    (folder / "report.md").write_text(markdown(content), encoding="utf-8")
    plot(content, folder / "mix.png")
    return folder / "report.md"


def print_summary(content: dict, folder: Path) -> None:
    ratio = content["ratio"]
    if content.get("unchanged") and not content.get("rejected"):
        print(f"mix: the values before were the search's best, written again: {content['verified']['capacity_rps']:.1f} "
              f"and {content['reference']['capacity_rps']:.1f} req/s, two measurements of the same values; "
              f"report {folder / 'report.md'}")
        return
    written = "kept the values before:" if content.get("rejected") else "tuned"
    print(f"mix: {written} {content['verified']['capacity_rps']:.1f} req/s vs the values before "
          f"{content['reference']['capacity_rps']:.1f} req/s"
          + ("" if ratio is None else f" ({ratio:.2f}x)") + f"; report {folder / 'report.md'}")
