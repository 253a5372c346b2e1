"""Tune each model's batchSize, maxBatchDelay and workers (threads follow) into config.properties.

    python -m benchmarks tune                          # every catalogue model, written to ./config.properties
    python -m benchmarks tune --model minilm --slo-ms 40
    python -m benchmarks tune --resume benchmarks/reports/tune-minilm-20261121-071200
    make tune [MODEL=<name>] [ARGS="..."]

Objective: the highest open-loop (Poisson) throughput whose p99 stays within the model's SLO
(catalogue slo_ms, or --slo-ms). Per model:
1. in-process batch service times s(b) for each thread count, fitted as a + c*b;
2. TorchServe's defaults measured: the "before" of the before/after table, and the search's first
   calibration point (chosen if nothing beats it);
3. model-guided search: predict every candidate, measure the best predicted one for real,
   recalibrate, repeat until gains fall under --min-gain-pct;
4. the chosen values written into the models= stanza of --config with a provenance record
   (refused when an archive's model-config.yaml would override config.properties);
5. verification: TorchServe restarted from the written file, GET /models/<name> checked, the open
   loop re-run at the tuned rate.
Every measurement is checkpointed in the report folder (benchmarks/reports/tune-<model>-<time>/):
an interrupted run resumes with --resume <folder>.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from benchmarks.load import cli
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.stats import P99_MIN_SAMPLES
from benchmarks.tune.checkpoint import Checkpoint
from benchmarks.tune.errors import CheckpointError, TuneError
from benchmarks.tune.mix import options as mix_cli
from benchmarks.tune.mix.pipeline import tune_mix
from benchmarks.tune.options import TuneOptions, record_of
from benchmarks.tune.pipeline import tune_model
from build.catalogue import Catalogue
from build.errors import BuildError
from handlers.runtime import usable_cores
from serving import processes
from serving.errors import LauncherError
from serving.repo import (
    CATALOGUE,
    shown,
)

# Per model: the full space's search on the reference machine fits (docs/tools.md#make-tune).
DEFAULT_BUDGET_MIN = 60.0


def parser() -> argparse.ArgumentParser:
    p = cli.parser("tune", __doc__.split("\n\n")[0])
    cli.add(p, "slo_ms", "model_store", "out", model={"action": "append", "help": "a catalogue model, repeatable "
                                                                                  "(default: all)"})
    p.add_argument("--resume", type=Path, metavar="FOLDER", help="resume an interrupted run (its options are reused)")
    g = p.add_argument_group("space")
    cli.add(g, device={"help": "where the workers run: cuda tunes for one GPU (the gpu space, unless --space says)"},
            config={"help": "config.properties to write"})
    # Not the shared --workers (one count): the space's worker counts.
    g.add_argument("--workers", type=cli.numbers(int), help="e.g. 1,2 (default: 1..cores)")
    g.add_argument("--space", default=None, choices=("full", "gpu", "reduced", "tiny"),
                   help="default: full on cpu, gpu on cuda")
    cli.add(g, batch_sizes={"help": "e.g. 1,2,4,8"})
    g.add_argument("--delays", type=cli.numbers(int), help="max batch delays in ms, e.g. 2,10")
    g = p.add_argument_group("search")
    cli.add(g, min_gain_pct={"default": 3.0}, max_points={"default": 6})
    g.add_argument("--max-candidates", type=int, default=6)
    g.add_argument("--patience", type=int, default=2, help="stop after this many candidates without gain")
    g.add_argument("--rate-step", type=float, default=1.25, help="rate factor while bracketing the SLO")
    g.add_argument("--rate-resolution", type=float, default=1.06, help="bracket ratio at which a rate search stops")
    g.add_argument("--fit-seconds", type=float, default=1.5, help="in-process time per (threads, batch size)")
    cli.add(g, variant={"action": "append", "help":"a catalogue variant to choose among (repeatable; default: every one that passed the "
                        "build's accuracy gate): each gets an in-process fit, the best predicted one is searched"})
    g.add_argument("--tie-pct", type=float, default=10.0,
                   help="prefer a shorter batch delay whose capacity is within this %% of the best (low-load latency); "
                        "0: capacity alone")
    g.add_argument("--ttft-samples", type=int, default=P99_MIN_SAMPLES,
                   help="a generating model (causal_lm): requests per candidate at least; the choice reads their "
                        f"TTFT p99, which needs {P99_MIN_SAMPLES:,}")
    g = p.add_argument_group("load (one open-loop point)")
    cli.add(g, "stable_windows", "connections", window_s={"default": 2.0}, max_windows={"default": 4},
            stability_pct={"default": 15.0}, warmup_s={"default": 3.0}, point_requests={"default": 2000},
            wait_quiet={"help": "shared machines: before the fit and each server start, wait up to this long for no "
                                "other TorchServe and CPU under 20%%, and repeat points other processes disturbed "
                                "(also with --resume; default: no waiting)"},
            budget_min={"default": DEFAULT_BUDGET_MIN,
                        "help": "time budget of each model's search, minutes: a candidate that would not end within "
                                "it is not measured, the best measured is written and verified (0: no budget)"})
    g = p.add_argument_group("steps")
    g.add_argument("--no-defaults", action="store_true", help="skip measuring TorchServe's defaults")
    g.add_argument("--no-write", action="store_true", help="leave config.properties alone")
    g.add_argument("--no-verify", action="store_true", help="skip the restart-and-re-measure check")
    g.add_argument("--verify-points", type=int, default=5,
                   help="the verification's capacity search (the benchmark's point): open-loop points at most")
    g.add_argument("--verify-warmup-s", type=float, default=30.0,
                   help="the verification: unmeasured load after the restart")
    g.add_argument("--verify-stability-pct", type=float, default=10.0,
                   help="the verification's stability rule: its last windows' throughput and p99 within this %% "
                        "of their mean (default: the benchmark's rule)")
    mix_cli.add_arguments(p)
    return p


def budget_s(args: argparse.Namespace) -> Optional[float]:
    return 60.0 * args.budget_min if args.budget_min else None


def runs_from(args: argparse.Namespace, argv: Sequence[str], verb: str = "tune") -> list[TuneOptions]:
    """One TuneOptions per model to tune: from the command line, or from a checkpoint to resume;
    `verb`: the command the reports record (tune, tune-ray)."""
    command = cli.command_line(verb, argv)
    if args.resume:
        folder = Path(args.resume).resolve()
        path = folder / "checkpoint.json"
        if not path.is_file():
            raise TuneError(f"nothing to resume: {path} not found")
        try:
            record = json.loads(path.read_text(encoding="utf-8"))["identity"]
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"cannot read {path}: {exc}") from exc
        Checkpoint(path, record)  # validates the file
        return [TuneOptions.from_record(record, folder, args.wait_quiet or 0.0, command, budget_s(args))]
    catalogue = Catalogue.load(CATALOGUE)
    runs = []
    for model in args.model or list(catalogue.names):
        entry = catalogue.entry(model)
        record = record_of(vars(args), model, args.slo_ms or entry.slo_ms, usable_cores())
        folder = cli.report_folder(args.out, "tune", model)
        runs.append(TuneOptions.from_record(record, folder, args.wait_quiet or 0.0, command, budget_s(args)))
    return runs


def progress_for(model: str) -> Callable[[str], None]:
    return cli.progress(f"tune {model}")


def main(argv: Sequence[str]) -> int:
    # SIGTERM unwinds like Ctrl-C: every server is stopped and the checkpoint is already on disk.
    processes.sigterm_as_interrupt()
    args = parser().parse_args(argv)
    if args.mix:
        return main_mix(args, argv)
    status = 0
    if not args.resume:  # a resumed run is one stateless model's
        generating, args.model = split_generating(args.model)
        for model in generating:
            status = max(status, main_generation(model, args, argv))
        if not args.model:
            return status
    runs = runs_from(args, argv)
    for options in runs:
        try:
            status = max(status, tune_model(options, progress_for(options.model)))
        except KeyboardInterrupt:
            print(f"\ninterrupted: resume with  .venv/bin/python -m benchmarks tune --resume {shown(options.folder)}",
                  file=sys.stderr)
            return 130
        except (LauncherError, BenchmarkError, BuildError) as exc:  # tuner, launcher, benchmark, config, build errors
            print(f"error [{options.model}]: {exc}", file=sys.stderr)
            status = 2
    return status


def split_generating(models: Optional[list[str]]) -> tuple:
    """(the generating models among those asked for (default: every catalogue model), the others)."""
    catalogue = Catalogue.load(CATALOGUE)
    asked = models or list(catalogue.names)
    generating = [m for m in asked if m in catalogue.names_of(generating=True)]
    return generating, [m for m in asked if m not in generating]


def main_generation(model: str, args: argparse.Namespace, argv: Sequence[str]) -> int:
    """A generating model: its own search (benchmarks/tune/generation.py), tokens/s under a TTFT SLO."""
    from benchmarks.tune import generation

    command = cli.command_line("tune", argv)
    slo = args.slo_ms or Catalogue.load(CATALOGUE).entry(model).slo_ms
    return generation.tune(model, slo, args.model_store, args.config, args.out, usable_cores(), not args.no_write,
                           args.ttft_samples, command, progress_for(model), budget_s(args))


def main_mix(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """A traffic mix: config.properties is written only at the end, so an interrupted run leaves it as it was."""
    options = mix_cli.mix_options(args, parser(), Catalogue.load(CATALOGUE), usable_cores(), cli.command_line("tune", argv))
    return tune_mix(options, progress_for("mix"))
