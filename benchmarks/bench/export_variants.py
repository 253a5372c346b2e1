"""In-process report of a model's export variants: eager, TorchScript, AOTInductor, ONNX (and int8).

    python -m benchmarks.bench.export_variants [--model efficientnet_lite0 --model minilm]
        [--variant aoti ...] [--batch-size 1 --batch-size 4 --batch-size 8] [--seconds 1.5] [--rounds 3]

Per model and variant, in this one process: the build of that variant alone (built fresh into a
scratch store: its export/compile seconds and the whole build's, the accuracy gate's figure against
fp32 eager on the held-out set, the archive's size); the worker's initialize on the extracted archive
(load, self-check, warm-up: time to ready); the whole handler's items/s per batch size (decode,
model, post-processing) and its p50 latency at batch 1, on one intra-op thread (a worker's budget
when two share the 2 cores). Rates are measured in rounds, every variant once per round, and each
variant's best round is kept, so a burst of load on the shared cores moves no variant alone.
The JSON keeps each variant's items/s per batch size (the tuner's fit reads service times so).
Writes benchmarks/reports/export-variants-<time>/ (report.md, report.json, one plot per model).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from benchmarks.load import cli
from benchmarks.load.inputs import worker_requests
from build.archive import BuildResult, build_entry
from build.catalogue import Catalogue
from build.errors import BuildError
from handlers import runtime
from serving.fake_context import FakeContext, extract
from serving.repo import CATALOGUE, REPO_ROOT

FIRST = ("eager", "torchscript", "aoti", "onnx")  # then the entry's other variants
BATCH_SIZES = (1, 4, 8)
THREADS = 1


@dataclass
class Row:
    variant: str
    archive_mib: Optional[float] = None
    export_s: Optional[float] = None  # export / trace / compile alone
    build_s: Optional[float] = None  # the variant's whole build: export, smoke test, gate, self-check, archive
    gate: Optional[str] = None
    gate_worst: Optional[float] = None
    ready_s: Optional[float] = None  # the handler's initialize: load, self-check, warm-up
    items_per_s: dict[str, float] = field(default_factory=dict)
    p50_ms_batch1: Optional[float] = None
    archived: bool = True
    precision: Optional[str] = None  # what the worker ran: its ready line's precision


def variants_of(catalogue: Catalogue, model: str, only: Optional[Sequence[str]]) -> list:
    """(name, raw catalogue item) to build: eager, torchscript, aoti, onnx, then the entry's others."""
    raw = {(item if isinstance(item, str) else next(iter(item))): item
           for item in catalogue.raw_entries[model].get("variants") or []}
    names = [*FIRST, *(n for n in raw if n not in FIRST)]
    return [(name, raw.get(name, name)) for name in names if only is None or name in only]


def build_one(catalogue: Catalogue, model: str, item, store: Path, progress) -> tuple[BuildResult, float, float]:
    """The variant alone, built fresh into `store`: (result, export seconds, build seconds)."""
    raw = {k: v for k, v in catalogue.raw_entries[model].items() if k not in ("serialisation", "variants")}
    alone = Catalogue(catalogue.path, {model: {**raw, "variants": [item]}})
    marks: dict[str, float] = {}

    def noted(message: str) -> None:
        for key, text in (("export", "exporting variant"), ("tried", "trying it on")):
            if text in message:
                marks.setdefault(key, time.perf_counter())
        progress(message)

    started = time.perf_counter()
    result = build_entry(alone, model, REPO_ROOT, store, force=True, progress=noted, speed_seconds=0.05)
    seconds = time.perf_counter() - started
    export_s = marks["tried"] - marks["export"] if {"tried", "export"} <= marks.keys() else float("nan")
    return result, export_s, seconds


def ready(model_dir: Path, model: str, batch_size: int):
    from handlers.handler import Handler

    context = FakeContext(model_dir, model, batch_size=batch_size, handler_overrides={"runtime": {"threads": THREADS}})
    handler = Handler()
    started = time.perf_counter()
    handler.initialize(context)
    return handler, context, time.perf_counter() - started


def timed_batches(handler, context, requests, batch_size: int, seconds: float) -> list[float]:
    """Seconds per handle() call on `batch_size` requests, over `seconds`, after two warm calls. A
    refused request stops the run: timing refusals would flatter the model."""
    bodies = [{"body": requests[i % len(requests)][0]} for i in range(batch_size)]
    headers = {i: {"Content-Type": requests[i % len(requests)][1]} for i in range(batch_size)}
    times: list[float] = []
    for call in range(10**9):
        context.headers, context.statuses = headers, {}
        began = time.perf_counter()
        handler.handle(bodies, context)
        if call >= 2:
            times.append(time.perf_counter() - began)
        if context.statuses:
            raise RuntimeError(f"the handler refused an example: {context.statuses}")
        if sum(times) >= seconds and len(times) >= 3:
            return times
    return times


def measure_model(catalogue: Catalogue, model: str, only, batch_sizes: Sequence[int], seconds: float, rounds: int,
                  scratch: Path, progress) -> list[Row]:
    rows, handlers = [], {}
    for name, item in variants_of(catalogue, model, only):
        progress(f"{model} {name}: building alone")
        try:
            result, export_s, build_s = build_one(catalogue, model, item, scratch / f"store-{model}-{name}", progress)
        except BuildError as err:  # built alone, the variant is its entry's default: a failed export raises
            rows.append(Row(name, gate=f"FAILED: {err}", archived=False))
            progress(f"{model} {name}: not built ({err})")
            continue
        line = result.variants[0]
        row = Row(name, None, round(export_s, 1), round(build_s, 1), line.gate, line.gate_worst)
        rows.append(row)
        if line.archive is None:
            row.archived = False
            progress(f"{model} {name}: not archived ({line.gate})")
            continue
        row.archive_mib = round(line.archive.stat().st_size / 2**20, 1)
        handler, context, row.ready_s = ready(extract(line.archive, scratch / f"{model}-{name}"), model, max(batch_sizes))
        row.ready_s = round(row.ready_s, 2)
        row.precision = runtime.precision_label(handler.settings.runtime, handler.autocast_dtype)
        handlers[name] = (handler, context)
        progress(f"{model} {name}: export {export_s:.1f} s, build {build_s:.1f} s, ready {row.ready_s} s, "
                 f"{row.archive_mib} MiB, gate {line.gate}")
    requests = worker_requests(model)
    best: dict[tuple[str, int], float] = {}
    p50s: dict[str, list[float]] = {}
    for turn in range(rounds):
        for batch_size in batch_sizes:
            for name, (handler, context) in handlers.items():
                times = timed_batches(handler, context, requests, batch_size, seconds)
                rate = batch_size * len(times) / sum(times)
                best[name, batch_size] = max(best.get((name, batch_size), 0.0), rate)
                if batch_size == 1:
                    p50s.setdefault(name, []).append(1000 * statistics.median(times))
        progress(f"{model}: round {turn + 1}/{rounds}: " + ", ".join(
            f"{name} {best[name, batch_sizes[-1]]:.1f}" for name in handlers) + f" items/s at batch {batch_sizes[-1]}")
    for row in rows:
        if row.variant in handlers:
            row.items_per_s = {str(b): round(best[row.variant, b], 1) for b in batch_sizes}
            row.p50_ms_batch1 = round(min(p50s[row.variant]), 2) if row.variant in p50s else None
    return rows


def markdown(report: dict) -> str:
    sizes = report["batch_sizes"]
    lines = [f"# Export variants, in-process ({report['when']})", "",
             f"`{report['command']}`: {THREADS} intra-op thread, whole handler (decode + model + post), "
             f"best of {report['rounds']} rounds of {report['seconds']} s per variant and batch size; each variant "
             "built alone, fresh. export s: the export/trace/compile alone; build s: export, smoke test, gate, "
             "self-check and archive; ready s: the handler's initialize (load, self-check, warm-up).", ""]
    for model, data in report["models"].items():
        lines += [f"## {model}", "", f"![{model}]({model}.png)", "", *cli.table(
            ("variant", "precision", *(f"items/s b{b}" for b in sizes), "p50 b1 ms", "export s", "build s", "archive MiB",
             "ready s", "gate"),
            [(r["variant"], r.get("precision") or "-", *(r["items_per_s"].get(str(b)) for b in sizes), r["p50_ms_batch1"], r["export_s"],
              r["build_s"], r["archive_mib"], r["ready_s"], r["gate"] if not r["archived"] else (
                  f"{r['gate_worst']:.4f}" if r["gate_worst"] is not None else "-"))
             for r in data["rows"]]), ""]
    return "\n".join(lines)


def plot(model: str, rows: list[Row], batch_sizes: Sequence[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [row for row in rows if row.items_per_s]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(shown))
    for i, row in enumerate(shown):
        xs = [j + i * width for j in range(len(batch_sizes))]
        ax.bar(xs, [row.items_per_s[str(b)] for b in batch_sizes], width, label=row.variant)
    ax.set_xticks([j + width * (len(shown) - 1) / 2 for j in range(len(batch_sizes))],
                  [f"batch {b}" for b in batch_sizes])
    ax.set_ylabel(f"items/s (whole handler, {THREADS} thread)")
    ax.set_title(f"{model}: export variants")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench.export_variants",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="a catalogue model; repeatable")
    parser.add_argument("--variant", action="append", help="repeatable; default: eager, torchscript, aoti, onnx "
                        "and the entry's other variants")
    parser.add_argument("--batch-size", action="append", type=int, help="repeatable; default: 1, 4, 8")
    parser.add_argument("--seconds", type=float, default=1.5, help="per variant, batch size and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "reports")
    args = parser.parse_args(argv)
    catalogue = Catalogue.load(CATALOGUE)
    models = args.model
    unknown = [m for m in models if m not in catalogue.names]
    if unknown:
        parser.error(f"--model {unknown[0]}: not in the catalogue ({', '.join(catalogue.names)})")
    batch_sizes = tuple(sorted(set(args.batch_size or BATCH_SIZES)))
    folder = cli.report_folder(args.out, "export-variants")
    report = {"command": " ".join(["python -m benchmarks.bench.export_variants", *(argv or sys.argv[1:])]),
              "when": time.strftime("%Y-%m-%d %H:%M"), "batch_sizes": list(batch_sizes), "seconds": args.seconds,
              "rounds": args.rounds, "threads": THREADS, "models": {}}
    progress = cli.progress("export-variants")
    with tempfile.TemporaryDirectory(prefix="export-variants-") as tmp:
        for model in models:
            rows = measure_model(catalogue, model, args.variant, batch_sizes, args.seconds, args.rounds,
                                          Path(tmp), progress)
            report["models"][model] = {"rows": [asdict(r) for r in rows], "slo_ms": catalogue.entry(model).slo_ms,
                                       "default": catalogue.entry(model).default_variant.name}
            folder.mkdir(parents=True, exist_ok=True)
            plot(model, rows, batch_sizes, folder / f"{model}.png")
    from benchmarks.load.environment import describe_environment

    report["environment"] = describe_environment()
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    (folder / "report.md").write_text(markdown(report))
    print(markdown(report))
    print(f"\nreport: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
