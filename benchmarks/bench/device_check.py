"""Every family on the CPU and on CUDA, in-process, within a stated time: the device check.

    python -m benchmarks.bench.device_check                       # here: the CPU (and CUDA when there is one)
    python -m benchmarks.bench.device_check --pack .device/pack   # what a GPU machine needs, small enough to carry
    python -m benchmarks.bench.device_check --from-pack .device/pack --devices cpu,cuda   # there (docs/tools.md)

For each catalogue model, the served handler (the archive's default variant, a fake TorchServe
context with `gpu_id: 0` for CUDA) on each device and precision:
- agreement with the CPU's fp32 answers on the catalogue's examples, by the family's gate kind
  (top-1 for classes, cosine for embeddings, the family's tolerance for tensors, greedy tokens for
  a causal LM);
- items/s of the whole handler (decode, collate, forward, post-process) by batch size, and of the
  bare model's forward on the same collated batches already on the device: the limit the handler
  is measured against;
- on CUDA: CUDA graphs off and on at batch 1, and the peak GPU memory;
- a causal LM: tokens/s of its engine at `--streams` concurrent greedy sequences.

A model whose archive was packed without its weights (too large to carry) gets random weights of
its architecture, the same ones on every device: agreement and speed do not need trained weights.
Every step asks the time budget first (`--budget-min`, default 6); what does not fit is named in
the report, never silently left out. Writes benchmarks/reports/device-check-<time>/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from benchmarks.bench.device_check_report import write_report
from benchmarks.bench.device_measure import agreement, bare_items_per_s, graph_speedup, handler_items_per_s, lm_check
from benchmarks.load.budget import Budget
from serving.errors import BenchmarkError
from serving.repo import CATALOGUE, MODEL_STORE, REPORTS

RANDOM_WEIGHTS = "random-weights.json"  # a packed archive's marker: make its weights at check time


@dataclass(frozen=True)
class CheckPlan:
    models: tuple[str, ...]
    devices: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    seconds: float
    budget_s: float
    streams: int
    catalogue: Path
    store: Path  # model_store/ (its .mar files) or a pack (one extracted folder per model)
    packed: bool
    out: Path
    command: str


def progress(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} [device-check] {line}", file=sys.stderr, flush=True)


def precisions(device: str) -> tuple[str, ...]:
    """fp32 everywhere; the reduced precision the device runs natively."""
    from handlers import runtime

    if device == "cuda":
        return ("fp32", "bf16" if torch.cuda.is_bf16_supported() else "fp16")
    return ("fp32", "bf16") if runtime.cpu_supports(torch.bfloat16) else ("fp32",)


def model_dir(plan: CheckPlan, model: str, tmp: Path) -> Path:
    """The model's extracted default archive, in a scratch copy (random weights are written into it)."""
    from build.catalogue import Catalogue
    from serving.fake_context import extract

    if plan.packed:
        folder = tmp / model
        shutil.copytree(plan.store / model, folder)
    else:
        entry = Catalogue.load(plan.catalogue).entry(model)
        archive = plan.store / entry.default_variant.archive_name(model)
        if not archive.is_file():
            raise BenchmarkError(f"{archive} is not built (make build)")
        folder = extract(archive, tmp / model)
    if (folder / RANDOM_WEIGHTS).is_file():
        random_weights(folder)
    return folder


def random_weights(folder: Path) -> None:
    """The archive's architecture with seeded random weights, written where its weights belong."""
    import yaml

    from handlers.families import family_class
    from handlers.self_check import FILE as SELF_CHECK_FILE
    from handlers.settings import HandlerSettings

    settings = HandlerSettings.from_mapping(yaml.safe_load((folder / "model-config.yaml").read_text())["handler"])
    family = family_class(settings.family)(settings.family_settings, folder)
    torch.manual_seed(0)
    model = family.wrap(settings.source.build(folder))
    torch.save(model.state_dict(), folder / settings.weights)
    # The archive's load-time self-check holds for the weights it shipped with, not for these.
    (folder / SELF_CHECK_FILE).unlink(missing_ok=True)


def handler_for(folder: Path, model: str, device: str, precision: str, batch_size: int,
                runtime: Optional[dict] = None, sections: Optional[dict] = None):
    """The archive's handler as a worker on `device` runs it, with these runtime settings and other
    handler sections changed."""
    from handlers.handler import Handler
    from serving.fake_context import FakeContext

    overrides = {"runtime": {"precision": precision, "warmup": True, **(runtime or {})}, **(sections or {})}
    context = FakeContext(folder, model, batch_size=batch_size, handler_overrides=overrides,
                          gpu_id=0 if device == "cuda" else None)
    handler = Handler()
    handler.initialize(context)
    if str(handler.device.type) != device:
        raise BenchmarkError(f"{model}: asked for {device}, the handler placed itself on {handler.device} "
                             f"({handler.placement.reason})")
    return handler, context


def check_model(plan: CheckPlan, model: str, folder: Path, budget: Budget) -> dict[str, Any]:
    """One model on every device and precision: its agreement, speed and memory."""
    from benchmarks.load.inputs import worker_requests
    from build.catalogue import Catalogue

    entry = Catalogue.load(plan.catalogue).entry(model)
    requests = worker_requests(model, plan.catalogue)
    top = max(plan.batch_sizes)
    result: dict[str, Any] = {"model": model, "family": entry.family, "variant": entry.default_variant.name,
                              "random_weights": (folder / RANDOM_WEIGHTS).is_file(), "rows": [], "agreement": [],
                              "graphs": None, "peak_gpu_mib": None}
    reference = None
    for device in plan.devices:
        for precision in precisions(device):
            need = 5.0 + 2 * plan.seconds * len(plan.batch_sizes)
            if not budget.allows(f"{model} on {device} {precision}", need):
                continue
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            handler, context = handler_for(folder, model, device, precision, top)
            answers = [json.loads(a) for a in handler.handle([{"body": body} for body, _ in requests], context)]
            if reference is None:
                reference = answers  # the first row: the CPU's fp32
            result["agreement"].append({"device": device, "precision": precision,
                                        **agreement(handler.family, reference, answers, precision)})
            for size in plan.batch_sizes:
                result["rows"].append({
                    "device": device, "precision": precision, "batch_size": size,
                    "handler_items_per_s": handler_items_per_s(handler, context, requests, size, plan.seconds),
                    "bare_items_per_s": bare_items_per_s(handler, requests, size, plan.seconds)})
                progress(f"{model} {device} {precision} batch {size}: " + ", ".join(
                    f"{k} {v:.1f}" for k, v in result["rows"][-1].items() if k.endswith("per_s")))
            if device == "cuda":
                result["peak_gpu_mib"] = max(result["peak_gpu_mib"] or 0.0, torch.cuda.max_memory_allocated() / 2**20)
                if precision == "fp32" and torch.version.cuda is not None \
                        and budget.allows(f"{model} CUDA graphs at batch 1", 10 + 2 * plan.seconds):
                    graphed, _ = handler_for(folder, model, device, precision, top, runtime={"cuda_graphs": True})
                    result["graphs"] = graph_speedup(handler, graphed, requests, plan.seconds)
    return result


def run(plan: CheckPlan) -> Path:
    from build.catalogue import Catalogue
    from handlers.families import family_class

    budget = Budget(plan.budget_s)
    catalogue = Catalogue.load(plan.catalogue)
    results = []
    with tempfile.TemporaryDirectory(prefix="device-check-") as tmp:
        for model in plan.models:
            folder = model_dir(plan, model, Path(tmp))
            progress(f"{model}: {catalogue.entry(model).family} from {folder.name}")
            if family_class(catalogue.entry(model).family).generates:
                results.append(lm_check(plan, model, folder, budget, handler_for, progress))
            else:
                results.append(check_model(plan, model, folder, budget))
    return write_report(plan, results, budget)


def pack(catalogue: Path, store: Path, into: Path, max_weights_mib: float) -> None:
    """Each model's extracted default archive, its weights dropped (and made at check time) when
    they are larger than max_weights_mib, and TorchServe's Python package without its frontend (the
    handlers' metrics import it) in site/: what a device machine needs, under the tool's 64 MiB."""
    import ts
    import yaml

    from build.catalogue import Catalogue
    from serving.fake_context import extract

    cat = Catalogue.load(catalogue)
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    shutil.copytree(Path(ts.__file__).parent, into / "site" / "ts",
                    ignore=shutil.ignore_patterns("frontend", "__pycache__", "*.jar"))
    for model in cat.names:
        archive = store / cat.entry(model).default_variant.archive_name(model)
        folder = extract(archive, into / model)
        weights = folder / yaml.safe_load((folder / "model-config.yaml").read_text())["handler"]["weights"]
        if weights.stat().st_size > max_weights_mib * 2**20 and weights.suffix == ".pt":
            weights.unlink()
            (folder / RANDOM_WEIGHTS).write_text(json.dumps({"dropped": weights.name}) + "\n")
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20
        print(f"{model}: {size:.1f} MiB" + (" (random weights at check time)" if (folder / RANDOM_WEIGHTS).is_file()
                                            else ""))


def main(argv: Optional[Sequence[str]] = None) -> int:
    from build.catalogue import Catalogue

    p = argparse.ArgumentParser(prog="python -m benchmarks.bench.device_check", description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", help="a catalogue model (repeatable; default: every one)")
    p.add_argument("--devices", default=None, help="comma-separated: cpu,cuda (default: cpu, and cuda when available)")
    p.add_argument("--batch-sizes", default="1,8,64", help="(default: %(default)s)")
    p.add_argument("--seconds", type=float, default=1.5, help="per measurement (default: %(default)s)")
    p.add_argument("--streams", type=int, default=32, help="a causal LM's concurrent sequences (default: %(default)s)")
    p.add_argument("--budget-min", type=float, default=6.0, help="the whole check (default: %(default)s)")
    p.add_argument("--catalogue", type=Path, default=CATALOGUE)
    p.add_argument("--store", type=Path, default=MODEL_STORE, help="model_store/ with the built archives")
    p.add_argument("--pack", type=Path, metavar="DIR", help="write the pack for a device machine into DIR and stop")
    p.add_argument("--max-weights-mib", type=float, default=20.0,
                   help="--pack: larger weights are dropped and made at random there (default: %(default)s)")
    p.add_argument("--from-pack", type=Path, metavar="DIR", help="read the models from a pack, not model_store/")
    p.add_argument("--out", type=Path, default=REPORTS)
    args = p.parse_args(argv)
    if args.pack:
        pack(args.catalogue, args.store, args.pack, args.max_weights_mib)
        return 0
    devices = tuple(args.devices.split(",")) if args.devices else ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    if set(devices) - {"cpu", "cuda"} or ("cuda" in devices and not torch.cuda.is_available()):
        print(f"--devices {args.devices}: cpu and/or cuda (cuda needs a CUDA build of torch and a GPU)", file=sys.stderr)
        return 2
    names = tuple(args.model or Catalogue.load(args.catalogue).names)
    plan = CheckPlan(names, devices, tuple(int(b) for b in args.batch_sizes.split(",")), args.seconds,
                     60.0 * args.budget_min, args.streams, args.catalogue.resolve(),
                     (args.from_pack or args.store).resolve(), args.from_pack is not None, args.out,
                     " ".join(["python", "-m", "benchmarks.bench.device_check", *(argv or sys.argv[1:])]))
    try:
        folder = run(plan)
    except BenchmarkError as err:
        print(f"device check failed: {err}", file=sys.stderr)
        return 1
    print(f"report: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
