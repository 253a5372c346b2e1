"""In-process handler benchmark: items/s of each setting against the naive path, no server.

    python -m benchmarks.bench.inprocess [--model <catalogue model>] [--batch-size 8] [--threads 2]

Every setting runs the whole handler (decode, forward, post-process) on the model's catalogue
examples, in one process, at the same batch size and thread count, so the ratios are comparable.
The naive path is fp32 eager with the family's naive settings (full-size image decoding; text
padded to max_length 128, as TorchServe's text examples do). Writes
benchmarks/reports/inprocess-<time>/ (JSON + a bar plot).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from benchmarks.load.inputs import worker_requests
from benchmarks.serving.errors import BenchmarkError
from benchmarks.serving.repo import CATALOGUE, MODEL_STORE, REPO_ROOT, REPORTS
from build.catalogue import Catalogue
from build.errors import BuildError
from handlers.families import family_class
from handlers.handler import Handler

EAGER = "state_dict"
SHIPPED = None  # the catalogue's own serialisation
_NAIVE_RUNTIME = {"precision": "fp32", "channels_last": False, "preprocess_threads": 1}


def variants(model: str) -> Dict[str, tuple]:
    """name -> (archive serialisation, handler-section overrides on top of that archive's settings).
    The first is the naive path the others are compared with."""
    entry = Catalogue.load(CATALOGUE).entry(model)
    family = family_class(entry.family)
    precision = (entry.settings.get("runtime") or {}).get("precision", "fp32")
    return {
        f"naive (fp32 eager, naive {family.name} settings)": (EAGER, {"runtime": _NAIVE_RUNTIME,
                                                                       family.name: dict(family.naive)}),
        f"eager fp32 + {family.name} settings": (EAGER, {"runtime": {"precision": "fp32"}}),
        f"eager {precision} + {family.name} settings": (EAGER, {}),
        f"shipped ({entry.serialisation} {precision})": (SHIPPED, {}),
    }


@dataclass
class Measurement:
    variant: str
    items_per_s: float
    batches: int
    seconds: float
    stage_ms_per_batch: Dict[str, float] = field(default_factory=dict)
    ratio_to_naive: float = 1.0


def extracted_archive(model: str, serialisation: Optional[str], into: Path) -> Path:
    """The catalogue's archive (from model_store), or one built with another serialisation."""
    from benchmarks.bench.bare_context import extract
    from build.archive import build_entry

    catalogue = Catalogue.load(CATALOGUE)
    store = MODEL_STORE
    if serialisation is not None and catalogue.raw_entries[model].get("serialisation") != serialisation:
        raw = {**catalogue.raw_entries[model], "serialisation": serialisation}
        catalogue, store = Catalogue(catalogue.path, {model: raw}), into / f"store-{serialisation}"
    result = build_entry(catalogue, model, REPO_ROOT, store, progress=lambda _: None)
    return extract(result.archive, into / f"{model}-{serialisation or 'shipped'}")


def measure(handler, context, requests: Sequence[Tuple[Any, str]], batch_size: int, seconds: float) -> Measurement:
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
    for kind, name, value, _ in context.metrics.calls:
        if name.endswith("Ms"):
            stage[name] = stage.get(name, 0.0) + value / count
    return Measurement("", count * batch_size / elapsed, count, elapsed, stage)


def run_variant(model: str, model_dir: Path, overrides: dict, batch_size: int, threads: int,
                seconds: float) -> Measurement:
    from benchmarks.bench.bare_context import FakeContext

    overrides = {**overrides, "runtime": {**overrides.get("runtime", {}), "threads": threads, "warmup": False}}
    context = FakeContext(model_dir, model, batch_size=batch_size, handler_overrides=overrides)
    handler = Handler()
    handler.initialize(context)
    return measure(handler, context, worker_requests(model), batch_size, seconds)


def run(models: List[str], batch_size: int, threads: int, seconds: float, only: Optional[List[str]] = None,
        progress=print) -> Dict[str, List[Measurement]]:
    results: Dict[str, List[Measurement]] = {}
    with tempfile.TemporaryDirectory(prefix="inprocess-") as tmp:
        for model in models:
            rows = []
            for name, (serialisation, overrides) in variants(model).items():
                if only and name not in only and not name.startswith("naive"):
                    continue
                progress(f"  {model}: {name} ...")
                model_dir = extracted_archive(model, serialisation, Path(tmp))
                row = run_variant(model, model_dir, overrides, batch_size, threads, seconds)
                row.variant = name
                rows.append(row)
                progress(f"  {model}: {name}: {row.items_per_s:.1f} items/s")
            naive = rows[0].items_per_s
            for row in rows:
                row.ratio_to_naive = row.items_per_s / naive
            results[model] = rows
    return results


def write_report(results: Dict[str, List[Measurement]], args: argparse.Namespace) -> Path:
    from benchmarks.serving.environment import describe_environment

    folder = REPORTS / f"inprocess-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    report = {
        "command": " ".join(["python", "-m", "benchmarks.bench.inprocess", *sys.argv[1:]]),
        "batch_size": args.batch_size, "threads": args.threads, "seconds_per_variant": args.seconds,
        "environment": describe_environment(),
        "results": {model: [asdict(row) for row in rows] for model, rows in results.items()},
    }
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    plot(results, folder / "throughput.png", args)
    return folder


def plot(results: Dict[str, List[Measurement]], path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4), squeeze=False)
    for ax, (model, rows) in zip(axes[0], results.items()):
        names = [row.variant for row in rows]
        values = [row.items_per_s for row in rows]
        bars = ax.barh(names, values, color=["#999999"] + ["#1f77b4"] * (len(rows) - 1))
        for bar, row in zip(bars, rows):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {row.ratio_to_naive:.1f}x",
                    va="center")
        ax.invert_yaxis()
        ax.set_xlabel("items/s (pre + inference + post)")
        ax.set_title(f"{model}, batch {args.batch_size}, {args.threads} threads")
        ax.set_xlim(0, max(values) * 1.2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench.inprocess", description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=Catalogue.load(CATALOGUE).names, help="default: all")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per variant")
    args = parser.parse_args(argv)
    try:
        results = run(args.model or list(Catalogue.load(CATALOGUE).names), args.batch_size, args.threads, args.seconds)
    except (BenchmarkError, BuildError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"\n{'model':<20}{'variant':<55}{'items/s':>10}{'vs naive':>10}")
    for model, rows in results.items():
        for row in rows:
            print(f"{model:<20}{row.variant:<55}{row.items_per_s:>10.1f}{row.ratio_to_naive:>9.2f}x")
    print(f"\nreport: {write_report(results, args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
