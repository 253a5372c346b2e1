"""Where a variant's forward pass spends its time, by operator, in-process on one thread.

    python -m benchmarks.bench.op_profile --model minilm --variant torchscript --variant onnx-int8 --batch-size 8

ONNX Runtime variants are profiled with the session's own profiler (per-node times in its JSON
trace), torch variants with torch.profiler (self CPU time per aten/quantized op). The batch is the
model's catalogue examples, collated as the handler does. Writes
benchmarks/reports/op-profile-<time>/ (report.json, report.md, ops.png: the top operators per variant).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from build.catalogue import Catalogue
from build.errors import BuildError
from serving.errors import BenchmarkError
from serving.repo import CATALOGUE, REPORTS, shown

RUNS = 30


def batch_of(model: str, model_dir: Path, size: int):
    import yaml

    from benchmarks.load.inputs import worker_requests
    from handlers.families import family_class
    from handlers.settings import HandlerSettings

    section = yaml.safe_load((model_dir / "model-config.yaml").read_text())["handler"]
    settings = HandlerSettings.from_mapping(section)
    family = family_class(settings.family)(settings.family_settings, model_dir, settings.runtime.channels_last)
    requests = worker_requests(model)
    items = [family.decode(*requests[i % len(requests)]) for i in range(size)]
    batch = family.collate(items)
    return settings, family.model_inputs(batch)


def onnx_ops(model_dir: Path, settings, batch) -> dict[str, float]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_profiling = True
    options.profile_file_prefix = str(model_dir / "ort")
    session = ort.InferenceSession(str(model_dir / settings.weights), options, providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), batch)}
    for _ in range(3):
        session.run(None, feeds)
    for _ in range(RUNS):
        session.run(None, feeds)
    trace = json.loads(Path(session.end_profiling()).read_text())
    ops: Counter = Counter()
    for event in trace:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            ops[event["args"]["op_name"]] += event["dur"] / 1000.0
    warm = 3 / (3 + RUNS)  # the warm-up runs are in the trace too: keep the measured runs' share
    return {op: ms * (1 - warm) / RUNS for op, ms in ops.items()}


def torch_ops(model_dir: Path, settings, batch) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    module = torch.jit.load(str(model_dir / settings.weights)).eval()
    with torch.inference_mode():
        for _ in range(3):
            module(*batch)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(RUNS):
                module(*batch)
    return {e.key: e.self_cpu_time_total / 1000.0 / RUNS for e in prof.key_averages() if e.self_cpu_time_total > 0}


def profile_variant(model: str, variant: str, size: int, tmp: Path) -> dict:
    from benchmarks.bench.inprocess import extracted_archive

    model_dir = extracted_archive(model, variant, tmp)
    settings, batch = batch_of(model, model_dir, size)
    torch.set_num_threads(1)
    if settings.runtime.graph == "onnx":
        ops = onnx_ops(model_dir, settings, batch)
    elif settings.runtime.graph == "torchscript":
        ops = torch_ops(model_dir, settings, batch)
    else:
        raise BenchmarkError(f"variant {variant}: only torchscript and onnx graphs are profiled here")
    total = sum(ops.values())
    return {"variant": variant, "total_ms": round(total, 3), "shape": [list(t.shape) for t in batch],
            "ops": [{"op": op, "ms": round(ms, 3), "share": round(ms / total, 3)}
                    for op, ms in sorted(ops.items(), key=lambda kv: -kv[1])]}


def write(rows: list[dict], args) -> Path:
    folder = REPORTS / f"op-profile-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    report = {"command": " ".join(["python", "-m", "benchmarks.bench.op_profile", *sys.argv[1:]]),
              "model": args.model, "batch_size": args.batch_size, "threads": 1, "runs": RUNS, "variants": rows}
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    md = [f"# Operator profile: {args.model}, batch {args.batch_size}, 1 thread", "",
          f"`{report['command']}`; per forward pass, mean of {RUNS}.", ""]
    for row in rows:
        md += [f"## {row['variant']}: {row['total_ms']:.2f} ms per batch (operators' own time)", "",
               "| operator | ms | share |", "|---|---|---|"]
        md += [f"| {o['op']} | {o['ms']:.3f} | {o['share']:.0%} |" for o in row["ops"][:12]] + [""]
    (folder / "report.md").write_text("\n".join(md))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(6 * len(rows), 4.5), squeeze=False)
    for ax, row in zip(axes[0], rows):
        top = row["ops"][:10][::-1]
        ax.barh([o["op"][:32] for o in top], [o["ms"] for o in top])
        ax.set_title(f"{row['variant']}: {row['total_ms']:.1f} ms / batch of {args.batch_size}")
        ax.set_xlabel("ms per forward pass (own time)")
    fig.tight_layout()
    fig.savefig(folder / "ops.png", dpi=110)
    plt.close(fig)
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench.op_profile", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, choices=Catalogue.load(CATALOGUE).names)
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="op-profile-") as tmp:
            for variant in args.variant:
                print(f"profiling {args.model} {variant}, batch {args.batch_size} ...", flush=True)
                rows.append(profile_variant(args.model, variant, args.batch_size, Path(tmp)))
                top = ", ".join(f"{o['op']} {o['share']:.0%}" for o in rows[-1]["ops"][:5])
                print(f"  {rows[-1]['total_ms']:.2f} ms per batch: {top}", flush=True)
    except (BenchmarkError, BuildError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"report: {shown(write(rows, args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
