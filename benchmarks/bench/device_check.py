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

A model packed without its weights (device_check_pack.py) gets random weights of its architecture,
the same ones on every device. Each example is sent with its content type, and a refused one fails
its row's agreement. Each row says what ran: the variant, the precision (a serialised graph runs the
one it was traced at, whatever was asked), TF32 on or off. A model that fails costs its own rows,
named in the report, not the report. Every step asks the time budget first (`--budget-min`, default
6); what does not fit is named in the report, never silently left out. Writes
benchmarks/reports/device-check-<time>/.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from benchmarks.bench.device_check_pack import RANDOM_WEIGHTS, folder_mib, pack, random_weights, read_config, what_runs
from benchmarks.bench.device_check_report import write_report
from benchmarks.bench.device_measure import agreement, answers_of, bare_items_per_s, graph_speedup, handler_items_per_s, lm_check, ran_as
from benchmarks.load import cli
from benchmarks.load.budget import Budget
from benchmarks.load.errors import BenchmarkError
from serving.repo import CATALOGUE

__all__ = ["RANDOM_WEIGHTS", "main", "pack", "run"]


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
    lm_tokens: int = 64  # a causal LM's tokens per stream in its tokens/s row


def progress(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} [device-check] {line}", file=sys.stderr, flush=True)


def precisions(device: str) -> tuple[str, ...]:
    """fp32 everywhere; the reduced precision the device runs natively."""
    from handlers import runtime

    if device == "cuda":
        return ("fp32", "bf16" if torch.cuda.is_bf16_supported() else "fp16")
    return ("fp32", "bf16") if runtime.cpu_supports(torch.bfloat16) else ("fp32",)


def model_dir(plan: CheckPlan, model: str, tmp: Path) -> tuple[Path, str]:
    """The model's extracted archive as a GPU host serves it (serving/gpu_archive.py), in a scratch copy
    (random weights are written into it), and what its rows run."""
    from build.catalogue import Catalogue
    from serving.fake_context import extract
    from serving.gpu_archive import served_on_gpu

    if plan.packed:
        folder = tmp / model
        shutil.copytree(plan.store / model, folder)
    else:
        entry = Catalogue.load(plan.catalogue).entry(model)
        archive = plan.store / entry.default_variant.archive_name(model)
        if not archive.is_file():
            raise BenchmarkError(f"{archive} is not built (make build)")
        folder = extract(served_on_gpu(archive, model), tmp / model)  # as the pack does: what a GPU host serves
    if what_runs(folder) is not None:
        return folder, random_weights(folder)
    return folder, "as built"


def handler_for(folder: Path, model: str, device: str, precision: str, batch_size: int,
                runtime: Optional[dict] = None, sections: Optional[dict] = None):
    """The archive's handler as a worker on `device` runs it, with these runtime settings and other
    handler sections changed."""
    from handlers.handler import Handler
    from handlers.settings import SERIALISED_GRAPHS
    from serving.fake_context import FakeContext

    graph = read_config(folder)["handler"]["runtime"].get("graph", "eager")
    # A serialised graph runs the precision it was traced or exported at: asking another changes only its label.
    asked = {} if graph in SERIALISED_GRAPHS else {"precision": precision}
    overrides = {"runtime": {**asked, "warmup": True, **(runtime or {})}, **(sections or {})}
    context = FakeContext(folder, model, batch_size=batch_size, handler_overrides=overrides,
                          gpu_id=0 if device == "cuda" else None)
    handler = Handler()
    handler.initialize(context)
    if str(handler.device.type) != device:
        raise BenchmarkError(f"{model}: asked for {device}, the handler placed itself on {handler.device} "
                             f"({handler.placement.reason})")
    return handler, context


def check_model(plan: CheckPlan, model: str, folder: Path, budget: Budget) -> dict[str, Any]:
    """One model on every device and precision: its agreement, speed and memory. A row that fails
    is recorded with its error and the next row goes on."""
    from benchmarks.load.inputs import worker_requests
    from build.catalogue import Catalogue

    entry = Catalogue.load(plan.catalogue).entry(model)
    requests = worker_requests(model, plan.catalogue)
    top = max(plan.batch_sizes)
    variant = read_config(folder)["handler"].get("variant") or entry.default_variant.name
    result: dict[str, Any] = {"model": model, "family": entry.family, "variant": variant,
                              "random_weights": (folder / RANDOM_WEIGHTS).is_file(), "rows": [], "agreement": [],
                              "errors": [], "graphs": None, "peak_gpu_mib": None}
    reference = None
    for device in plan.devices:
        if device == "cuda" and read_config(folder)["handler"]["runtime"].get("device") == "cpu":
            result.setdefault("skipped", []).append(
                "cuda: the archive runs on the CPU on a GPU host too (runtime.device: cpu: an AOTInductor package "
                "compiled for the CPU, or an ONNX or int8 variant), so it has no GPU rows")
            progress(f"{model}: {result['skipped'][-1]}")
            continue
        done: set[str] = set()
        for precision in precisions(device):
            need = 5.0 + 2 * plan.seconds * len(plan.batch_sizes)
            if not budget.allows(f"{model} on {device} {precision}", need):
                continue
            try:
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                handler, context = handler_for(folder, model, device, precision, top)
                label = ran_as(handler)
                if label["precision"] in done:  # a serialised graph, or a precision this device lacks: ran already
                    continue
                done.add(label["precision"])
                answers, refused = answers_of(handler, context, requests)
                if reference is None and not refused:
                    reference = answers  # the first row: the CPU's fp32
                result["agreement"].append({"device": device, **label, **agreement(
                    handler.family, reference or answers, answers, label["precision"], refused)})
                for size in plan.batch_sizes:
                    result["rows"].append({
                        "device": device, **label, "batch_size": size,
                        "handler_items_per_s": handler_items_per_s(handler, context, requests, size, plan.seconds),
                        "bare_items_per_s": bare_items_per_s(handler, requests, size, plan.seconds)})
                    progress(f"{model} {device} {label['precision']} batch {size}: " + ", ".join(
                        f"{k} {v:.1f}" for k, v in result["rows"][-1].items() if k.endswith("per_s")))
                if device == "cuda":
                    peak = torch.cuda.max_memory_allocated() / 2**20
                    result["peak_gpu_mib"] = max(result["peak_gpu_mib"] or 0.0, peak)
                    if label["precision"] == "fp32" and torch.version.cuda is not None \
                            and budget.allows(f"{model} CUDA graphs at batch 1", 10 + 2 * plan.seconds):
                        graphed, _ = handler_for(folder, model, device, precision, top, runtime={"cuda_graphs": True})
                        result["graphs"] = graph_speedup(handler, graphed, requests, plan.seconds)
            except Exception as err:  # noqa: BLE001 - one failing row is reported, the check goes on
                failed(result, f"{device} {precision}", err)
    return result


def failed(result: dict[str, Any], where: str, err: BaseException) -> None:
    """A step that raised: its error in the report and the log; the rest of the check goes on."""
    line = f"{where}: {type(err).__name__}: {err}"[:500]
    result.setdefault("errors", []).append(line)
    progress(f"{result['model']} FAILED {line}")


def run(plan: CheckPlan) -> Path:
    from build.catalogue import Catalogue
    from handlers.families import family_class

    budget = Budget(plan.budget_s)
    catalogue = Catalogue.load(plan.catalogue)
    results = []
    with tempfile.TemporaryDirectory(prefix="device-check-") as tmp:
        for model in plan.models:
            family = catalogue.entry(model).family
            try:
                folder, runs = model_dir(plan, model, Path(tmp))
                progress(f"{model}: {family} from {folder.name} ({runs})")
                if family_class(family).generates:
                    result = lm_check(plan, model, folder, budget, handler_for, progress)
                else:
                    result = check_model(plan, model, folder, budget)
                result["runs"] = runs
            except Exception as err:  # noqa: BLE001 - one model that cannot run costs its own rows only
                result = {"model": model, "family": family, "variant": catalogue.entry(model).default_variant.name,
                          "rows": [], "agreement": [], "errors": [], "graphs": None, "peak_gpu_mib": None}
                failed(result, "setting up", err)
            results.append(result)
    return write_report(plan, results, budget)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from build.catalogue import Catalogue

    argv = list(sys.argv[1:] if argv is None else argv)
    p = cli.parser("device-check", __doc__.splitlines()[0])
    cli.add(p, "model_store", "out", model={"action": "append", "help": "a catalogue model (repeatable; default: every one)"},
            batch_sizes={"default": (1, 8, 64)}, seconds={"default": 1.5, "help": "per measurement"},
            budget_min={"default": 6.0, "help": "the whole check"})
    p.add_argument("--devices", default=None, help="comma-separated: cpu,cuda (default: cpu, and cuda when available)")
    p.add_argument("--streams", type=int, default=32, help="a causal LM's concurrent sequences")
    p.add_argument("--lm-tokens", type=int, default=64, help="a causal LM's tokens per stream")
    p.add_argument("--catalogue", type=Path, default=CATALOGUE)
    p.add_argument("--pack", type=Path, metavar="DIR", help="write the pack for a device machine into DIR and stop")
    p.add_argument("--max-weights-mib", type=float, default=20.0,
                   help="--pack: larger weights are dropped and made at random there")
    p.add_argument("--from-pack", type=Path, metavar="DIR", help="read the models from a pack, not model_store/")
    args = p.parse_args(argv)
    if args.pack:
        try:
            packed = pack(args.catalogue, args.model_store, args.pack, args.max_weights_mib)
        except BenchmarkError as err:
            print(f"device check pack failed: {err}", file=sys.stderr)
            return 1
        for p in packed:
            print(f"{p.model} ({p.variant}): {p.mib:.1f} MiB, {p.how}")
        print(f"{args.pack}: {folder_mib(args.pack):.1f} MiB")
        return 0
    devices = tuple(args.devices.split(",")) if args.devices else ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    if set(devices) - {"cpu", "cuda"} or ("cuda" in devices and not torch.cuda.is_available()):
        print(f"--devices {args.devices}: cpu and/or cuda (cuda needs a CUDA build of torch and a GPU)", file=sys.stderr)
        return 2
    names = tuple(args.model or Catalogue.load(args.catalogue).names)
    plan = CheckPlan(names, devices, args.batch_sizes, args.seconds, 60.0 * args.budget_min, args.streams,
                     args.catalogue.resolve(), (args.from_pack or args.model_store).resolve(), args.from_pack is not None,
                     args.out, cli.command_line("device-check", argv), args.lm_tokens)
    try:
        folder = run(plan)
    except BenchmarkError as err:
        print(f"device check failed: {err}", file=sys.stderr)
        return 1
    print(f"report: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
