"""In-process handler benchmark: items/s of each setting against the naive path, no server.

    python -m benchmarks bench-inprocess [--model <catalogue model>] [--batch-size 1 --batch-size 8] [--threads 1]

Every setting runs the whole handler (decode, forward, post-process) on the model's catalogue
examples, in one process, at the same batch size and thread count, so the ratios are comparable:
the naive path, eager with the family's settings, and every variant of the catalogue entry
(build/variants.py; one the accuracy gate rejected is listed as skipped), each also against the
entry's default variant.
The naive path is fp32 eager with the family's naive settings (full-size image decoding; text
padded to max_length 128, as TorchServe's text examples do; forecasts post-processed by a Python
loop per value). Writes benchmarks/reports/inprocess-<time>/ (report.md, JSON, a bar plot).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from benchmarks.load import cli
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.inputs import worker_requests
from build.catalogue import Catalogue
from handlers.families import family_class
from handlers.handler import Handler
from serving.repo import CATALOGUE, MODEL_STORE, REPO_ROOT

EAGER = "eager"
_NAIVE_RUNTIME = {"precision": "fp32", "channels_last": False, "preprocess_threads": 1}


@dataclass(frozen=True)
class Setting:
    """One row: an archive variant (build/variants.py) and handler-section overrides on top of it."""

    name: str
    variant: str
    overrides: dict[str, Any] = field(default_factory=dict)
    default: bool = False  # the catalogue's default variant: what the others are also compared with


def settings_to_run(model: str) -> list[Setting]:
    """The naive path first (what everything is compared with), eager with the family's settings,
    then every variant of the catalogue entry."""
    entry = Catalogue.load(CATALOGUE).entry(model)
    family = family_class(entry.family)
    precision = (entry.settings.get("runtime") or {}).get("precision", "fp32")
    rows = [
        Setting(f"naive (fp32 eager, naive {family.name} settings)", EAGER,
                {"runtime": _NAIVE_RUNTIME, family.name: dict(family.naive)}),
        Setting(f"eager fp32 + {family.name} settings", EAGER, {"runtime": {"precision": "fp32"}}),
    ]
    if precision != "fp32":
        rows.append(Setting(f"eager {precision} + {family.name} settings", EAGER))
    for variant in entry.variants:
        what = {"torchscript": f"TorchScript {precision}", "eager": f"eager {precision}",
                "compile": f"torch.compile {precision}"}.get(variant.name, variant.name)
        label = f"variant {variant.name} ({what}{', default' if variant.default else ''})"
        rows.append(Setting(label, variant.name, default=variant.default))
    return rows


@dataclass
class Measurement:
    variant: str
    batch_size: int
    items_per_s: float
    batches: int
    seconds: float
    stage_ms_per_batch: dict[str, float] = field(default_factory=dict)
    ratio_to_naive: float = 1.0
    ratio_to_default: Optional[float] = None  # to the catalogue's default variant, same batch size
    gate: Optional[str] = None  # the build's accuracy gate verdict for this archive


def extracted_archive(model: str, variant: Optional[str], into: Path) -> Path:
    """The extracted archive of a variant (None: the catalogue's default); an error when the build's
    accuracy gate rejected it."""
    model_dir, gate = extracted_variant(model, variant, into)
    if model_dir is None:
        raise BenchmarkError(f"{model}: variant {variant} is not archived: {gate}")
    return model_dir


def extracted_variant(model: str, variant: Optional[str], into: Path) -> tuple[Optional[Path], Optional[str]]:
    """(the extracted archive or None when the gate rejected it, the gate's verdict): a catalogue
    variant from model_store (built if stale), or one built on the side (the eager rows)."""
    from build.archive import build_entry
    from serving.fake_context import extract

    catalogue = Catalogue.load(CATALOGUE)
    store = MODEL_STORE
    variant = variant or catalogue.entry(model).default_variant.name
    if variant not in [v.name for v in catalogue.entry(model).variants]:
        raw = {k: v for k, v in catalogue.raw_entries[model].items() if k not in ("serialisation", "variants")}
        catalogue, store = Catalogue(catalogue.path, {model: {**raw, "variants": [variant]}}), into / f"store-{variant}"
    result = build_entry(catalogue, model, REPO_ROOT, store, progress=lambda _: None)
    line = next(v for v in result.variants if v.variant == variant)
    if line.archive is None:
        return None, line.gate
    return extract(line.archive, into / f"{model}-{variant}"), line.gate


def measure(handler, context, requests: Sequence[tuple[Any, str]], batch_size: int, seconds: float) -> Measurement:
    """Whole-handler throughput over a cycling set of real requests, after two warm batches. A
    request the handler refuses stops the measurement: timing rejections would flatter the model."""
    picks = [[(b * batch_size + i) % len(requests) for i in range(batch_size)] for b in range(8)]
    batches = [[{"body": requests[k][0]} for k in pick] for pick in picks]
    headers = [{i: {"Content-Type": requests[k][1]} for i, k in enumerate(pick)} for pick in picks]

    def handle(index: int) -> None:
        context.headers, context.statuses = headers[index % len(batches)], {}
        handler.handle(batches[index % len(batches)], context)
        if context.statuses:
            i, (status, message) = next(iter(context.statuses.items()))
            raise BenchmarkError(f"the handler refused example {picks[index % len(batches)][i]}: {status} {message}")

    handle(0)
    handle(1)
    context.metrics.calls.clear()
    count, started = 0, time.perf_counter()
    while True:
        handle(count)
        count += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds and count >= 3:
            break
    stage = {}
    for _kind, name, value, _ in context.metrics.calls:
        if name.endswith("Ms"):
            stage[name] = stage.get(name, 0.0) + value / count
    return Measurement("", batch_size, count * batch_size / elapsed, count, elapsed, stage)


def run_variant(model: str, model_dir: Path, overrides: dict, batch_size: int, threads: int,
                seconds: float, device: str = "cpu") -> Measurement:
    """`device`: cuda runs the handler as a worker handed gpu_id 0."""
    from serving.fake_context import FakeContext

    overrides = {**overrides, "runtime": {**overrides.get("runtime", {}), "threads": threads, "warmup": False}}
    context = FakeContext(model_dir, model, batch_size=batch_size, handler_overrides=overrides,
                          gpu_id=0 if device == "cuda" else None)
    handler = Handler()
    handler.initialize(context)
    return measure(handler, context, worker_requests(model), batch_size, seconds)


def run(models: list[str], batch_sizes: Sequence[int], threads: int, seconds: float, only: Optional[list[str]] = None,
        progress=print, device: str = "cpu") -> dict[str, list[Measurement]]:
    """Every setting of every model at every batch size, in this one process (so the ratios compare)."""
    results: dict[str, list[Measurement]] = {}
    with tempfile.TemporaryDirectory(prefix="inprocess-") as tmp:
        for model in models:
            rows = []
            for setting in settings_to_run(model):
                if only and setting.name not in only and not setting.name.startswith("naive"):
                    continue
                model_dir, gate = extracted_variant(model, setting.variant, Path(tmp))
                if model_dir is None:
                    progress(f"  {model}: {setting.name}: not archived ({gate}): skipped")
                    continue
                for batch_size in batch_sizes:
                    progress(f"  {model}: {setting.name}, batch {batch_size} ...")
                    row = run_variant(model, model_dir, setting.overrides, batch_size, threads, seconds, device)
                    row.variant, row.gate = setting.name, gate
                    row.ratio_to_default = 1.0 if setting.default else None
                    rows.append(row)
                    progress(f"  {model}: {setting.name}, batch {batch_size}: {row.items_per_s:.1f} items/s")
            for batch_size in batch_sizes:
                same = [row for row in rows if row.batch_size == batch_size]
                default = next((r.items_per_s for r in same if r.ratio_to_default == 1.0), None)
                for row in same:
                    row.ratio_to_naive = row.items_per_s / same[0].items_per_s
                    row.ratio_to_default = None if default is None else row.items_per_s / default
            results[model] = rows
    return results


def write_report(results: dict[str, list[Measurement]], args: argparse.Namespace, command: str) -> Path:
    from benchmarks.load.environment import describe_environment

    folder = cli.report_folder(args.out, "inprocess")
    folder.mkdir(parents=True, exist_ok=True)
    report = {
        "command": command, "batch_sizes": args.batch_size, "threads": args.threads,
        "seconds_per_variant": args.seconds, "device": args.device, "environment": describe_environment(),
        "results": {model: [asdict(row) for row in rows] for model, rows in results.items()},
    }
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    (folder / "report.md").write_text(markdown(results, report))
    plot(results, folder / "throughput.png", args)
    return folder


def markdown(results: dict[str, list[Measurement]], report: dict) -> str:
    """One table per model: items/s, the ratios, and where a batch's time goes (the handler's stage metrics)."""
    lines = [f"# In-process handler throughput ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"`{report['command']}`: {report['threads']} intra-op thread(s), {report['seconds_per_variant']} s per "
             "row, whole handler (decode + collate + model + post-processing + JSON), no server.", "",
             "![throughput](throughput.png)", ""]
    for model, rows in results.items():
        stages = [[row.stage_ms_per_batch.get(f"Handler{name}Ms") for name in ("Preprocess", "Inference", "Postprocess")]
                  for row in rows]
        lines += [f"## {model}", "", *cli.table(
            ("setting", "batch", "items/s", "vs naive", "vs default", "pre ms", "model ms", "post ms (per batch)"),
            [(row.variant, row.batch_size, f"{row.items_per_s:.1f}", f"{row.ratio_to_naive:.2f}x",
              f"{row.ratio_to_default:.2f}x" if row.ratio_to_default else "",
              *(None if v is None else f"{v:.2f}" for v in stage)) for row, stage in zip(rows, stages)]), ""]
    return "\n".join(lines)


def plot(results: dict[str, list[Measurement]], path: Path, args) -> None:
    panels = [(model, b) for model in results for b in args.batch_size]
    height = 0.5 * max(len(r) for r in results.values()) / len(args.batch_size) + 2.5
    with cli.figure(path, 1, len(panels), figsize=(6.5 * len(panels), height), squeeze=False) as axes:
        for ax, (model, batch_size) in zip(axes[0], panels):
            rows = [row for row in results[model] if row.batch_size == batch_size]
            values = [row.items_per_s for row in rows]
            colours = ["#999999" if row.variant.startswith("naive") else "#2ca02c" if row.ratio_to_default == 1.0
                       else "#1f77b4" for row in rows]
            bars = ax.barh([row.variant for row in rows], values, color=colours)
            for bar, row in zip(bars, rows):
                vs_default = f", {row.ratio_to_default:.2f}x default" if row.ratio_to_default else ""
                ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {row.ratio_to_naive:.1f}x naive{vs_default}",
                        va="center", fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel("items/s (pre + inference + post)")
            ax.set_title(f"{model}, batch {batch_size}, {args.threads} thread(s)")
            ax.set_xlim(0, max(values) * 1.45)


def main(argv: Sequence[str]) -> int:
    p = cli.parser("bench-inprocess", __doc__.splitlines()[0])
    # A generating model's in-process figures (KV cache vs recompute): python -m benchmarks generation
    cli.add(p, "device", "out", model={"action": "append", "choices": Catalogue.load(CATALOGUE).names_of(generating=False),
                                       "help": "repeatable; default: all but the generating ones (`generation` verb)"},
            batch_size={"action": "append", "help": "repeatable; default: 1 and 8"},
            threads={"default": 1, "help": "intra-op threads (a worker's budget)"},
            seconds={"default": 5.0, "help": "measured time per variant"})
    args = p.parse_args(argv)
    args.batch_size = args.batch_size or [1, 8]
    results = run(args.model or list(Catalogue.load(CATALOGUE).names_of(generating=False)), args.batch_size,
                  args.threads, args.seconds, device=args.device)
    print(f"\n{'model':<20}{'setting':<52}{'batch':>6}{'items/s':>10}{'vs naive':>10}{'vs default':>11}")
    for model, rows in results.items():
        for row in rows:
            vs_default = f"{row.ratio_to_default:>10.2f}x" if row.ratio_to_default else f"{'':>11}"
            print(f"{model:<20}{row.variant:<52}{row.batch_size:>6}{row.items_per_s:>10.1f}{row.ratio_to_naive:>9.2f}x"
                  f"{vs_default}")
    print(f"\nreport: {write_report(results, args, cli.command_line('bench-inprocess', argv))}")
    return 0
