"""Tune each model's batchSize, maxBatchDelay and workers (threads follow) into config.properties.

    python -m benchmarks.tune                          # every catalogue model, written to ./config.properties
    python -m benchmarks.tune --model minilm --slo-ms 40
    python -m benchmarks.tune --model efficientnet_lite0 --space reduced --grid --no-write
    python -m benchmarks.tune --resume benchmarks/reports/tune-minilm-20261121-071200
    make tune [MODEL=<name>] [ARGS="..."]

Objective: the highest open-loop (Poisson) throughput whose p99 stays within the model's SLO
(catalogue slo_ms, or --slo-ms). Per model:
1. in-process batch service times s(b) for each thread count, fitted as a + c*b;
2. TorchServe's defaults measured: the "before" of the before/after table, and the search's first
   calibration point (chosen if nothing beats it);
3. model-guided search: predict every candidate, measure the best predicted one for real,
   recalibrate, repeat until gains fall under --min-gain-pct;
4. optionally the exhaustive grid of the same space (--grid), to judge the search; when the
   search's pick is not the grid's best, the two are measured again head to head;
5. the chosen values written into the models= stanza of --config with a provenance record
   (refused when an archive's model-config.yaml would override config.properties);
6. verification: TorchServe restarted from the written file, GET /models/<name> checked, the open
   loop re-run at the tuned rate.
Every measurement is checkpointed in the report folder (benchmarks/reports/tune-<model>-<time>/):
an interrupted run resumes with --resume <folder>.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from benchmarks.serving import processes
from benchmarks.serving.errors import LauncherError
from benchmarks.load.stats import StabilityRule
from benchmarks.tune.errors import TuneError
from build.errors import BuildError
from benchmarks.serving.repo import REPO_ROOT, CATALOGUE, MODEL_STORE, DEFAULT_CONFIG, REPORTS

NOT_IDENTITY = ("folder", "wait_quiet")


def _ints(text: str) -> tuple:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tune", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", action="append", help="a catalogue model, repeatable (default: all)")
    p.add_argument("--slo-ms", type=float, help="p99 target (default: the catalogue's slo_ms)")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="config.properties to write")
    p.add_argument("--model-store", type=Path, default=MODEL_STORE)
    p.add_argument("--out", type=Path, default=REPORTS, help="reports folder")
    p.add_argument("--resume", type=Path, metavar="FOLDER", help="resume an interrupted run (its options are reused)")
    g = p.add_argument_group("space")
    g.add_argument("--space", default="full", choices=("full", "reduced", "tiny"))
    g.add_argument("--workers", type=_ints, help="e.g. 1,2 (default: 1..cores)")
    g.add_argument("--batch-sizes", type=_ints, help="e.g. 1,2,4,8")
    g.add_argument("--delays", type=_ints, help="max batch delays in ms, e.g. 2,10")
    g = p.add_argument_group("search")
    g.add_argument("--min-gain-pct", type=float, default=3.0, help="stop when the next candidate gains less")
    g.add_argument("--max-candidates", type=int, default=6)
    g.add_argument("--patience", type=int, default=2, help="stop after this many candidates without gain")
    g.add_argument("--rate-step", type=float, default=1.25, help="rate factor while bracketing the SLO")
    g.add_argument("--rate-resolution", type=float, default=1.06, help="bracket ratio at which a rate search stops")
    g.add_argument("--max-points", type=int, default=6, help="open-loop points per candidate at most")
    g.add_argument("--fit-seconds", type=float, default=1.5, help="in-process time per (threads, batch size)")
    g.add_argument("--grid", action="store_true", help="also measure every candidate (model-free), to compare")
    g = p.add_argument_group("load (one open-loop point)")
    g.add_argument("--window-s", type=float, default=2.0)
    g.add_argument("--max-windows", type=int, default=4, help="measured windows per point at most")
    g.add_argument("--stable-windows", type=int, default=3)
    g.add_argument("--stability-pct", type=float, default=15.0)
    g.add_argument("--warmup-s", type=float, default=3.0, help="unmeasured load after each server start")
    g.add_argument("--connections", type=int, default=64)
    g.add_argument("--wait-quiet", type=float, metavar="SECONDS",
                   help="shared machines: before the fit and each server start, wait up to this long for no other "
                        "TorchServe and CPU under 20%%, and repeat points other processes disturbed (also with "
                        "--resume; default: no waiting)")
    g = p.add_argument_group("steps")
    g.add_argument("--no-defaults", action="store_true", help="skip measuring TorchServe's defaults")
    g.add_argument("--no-write", action="store_true", help="leave config.properties alone")
    g.add_argument("--no-verify", action="store_true", help="skip the restart-and-re-measure check")
    return p


@dataclass(frozen=True)
class TuneConfig:
    """One model's run, built from the command line (or from a checkpoint, to resume)."""

    model: str
    options: dict  # JSON-able: the checkpoint identity, and how --resume rebuilds the run
    command: str

    def __getattr__(self, name: str):
        try:
            return self.options[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def space(self):
        from benchmarks.tune.space import preset

        return preset(self.options["space"], self.options["cores"], self.options["workers"],
                      self.options["batch_sizes"], self.options["delays"])

    @property
    def search_settings(self):
        from benchmarks.tune.search import RateSettings, SearchSettings

        o = self.options
        return SearchSettings(o["min_gain_pct"], o["max_candidates"], o["patience"],
                              RateSettings(o["rate_step"], o["rate_resolution"], o["max_points"]))

    @property
    def load(self):
        from benchmarks.tune.measure import LoadSettings

        o = self.options
        rule = StabilityRule(tolerance_pct=o["stability_pct"], last=o["stable_windows"],
                             max_windows=max(o["max_windows"], o["stable_windows"]), warmup=1)
        return LoadSettings(o["window_s"], rule, o["connections"], o["warmup_s"])


def configs_from(args: argparse.Namespace, argv: Sequence[str]) -> list:
    from benchmarks.tune.checkpoint import Checkpoint
    from build.catalogue import Catalogue
    from handlers.runtime import usable_cores

    command = shlex.join([".venv/bin/python", "-m", "benchmarks.tune", *argv])
    if args.resume:
        path = Path(args.resume) / "checkpoint.json"
        if not path.is_file():
            raise TuneError(f"nothing to resume: {path} not found")
        import json

        identity = json.loads(path.read_text(encoding="utf-8"))["identity"]
        Checkpoint(path, identity)  # validates the file
        options = {**identity, "folder": str(Path(args.resume).resolve()), "wait_quiet": args.wait_quiet or 0.0}
        return [TuneConfig(identity["model"], options, command)]
    catalogue = Catalogue.load(CATALOGUE)
    models = args.model or list(catalogue.names)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = []
    for model in models:
        entry = catalogue.entry(model)
        options = {k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v)
                   for k, v in vars(args).items() if k not in ("model", "resume")}
        options.update(model=model, slo_ms=args.slo_ms or entry.slo_ms, cores=usable_cores(),
                       wait_quiet=args.wait_quiet or 0.0,
                       config=str(Path(args.config).resolve()), model_store=str(Path(args.model_store).resolve()),
                       folder=str((Path(args.out) / f"tune-{model}-{stamp}").resolve()))
        out.append(TuneConfig(model, options, command))
    return out


def progress_for(model: str) -> Callable[[str], None]:
    def progress(line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} [tune {model}] {line}", file=sys.stderr, flush=True)
    return progress


def tune_model(cfg: TuneConfig) -> int:
    """One model, end to end. 0: tuned (and verified, unless skipped); 1: verification failed."""
    from benchmarks.tune import report as tune_report
    from benchmarks.tune.config_writer import check_archives
    from benchmarks.serving.environment import describe_environment
    from benchmarks.tune.service_model import FitPoint, ServiceModel
    from benchmarks.tune.checkpoint import Checkpoint
    from benchmarks.serving.resources import machine_conditions
    from benchmarks.tune.measure import ServedMeasurer, inprocess_fit, wait_for_quiet
    from benchmarks.tune.outcome import build_report, print_summary, write_and_verify
    from benchmarks.tune.judge import head_to_head
    from benchmarks.tune.search import best_of, evaluate, grid, search
    from benchmarks.tune.space import torchserve_defaults
    from build.archive import build_entry
    from build.catalogue import Catalogue

    progress = progress_for(cfg.model)
    folder = Path(cfg.folder)
    # What decides the measurements; where they go and how patiently they wait for quiet do not.
    identity = {k: v for k, v in cfg.options.items() if k not in NOT_IDENTITY}
    checkpoint = Checkpoint(folder / "checkpoint.json", identity)
    if checkpoint.resumed:
        progress(f"resuming from {folder}: measurements already taken are replayed, not repeated")
    space, slo = cfg.space, cfg.slo_ms
    store, config = Path(cfg.model_store), Path(cfg.config)
    progress(f"SLO p99 <= {slo:g} ms; space: {len(space.candidates())} candidates over {space.to_json()}; "
             f"report {folder}")
    archive = build_entry(Catalogue.load(CATALOGUE), cfg.model, REPO_ROOT, store, progress=progress).archive
    if not cfg.no_write:
        check_archives({cfg.model: archive})  # refuse before an hour of measuring, not after
    before = machine_conditions()
    if before["other_torchserve_pids"]:
        progress(f"warning: other TorchServe servers are running (pids {before['other_torchserve_pids']}): "
                 "they share the cores, numbers will be noisy")

    defaults = torchserve_defaults(space.cores)
    threads = sorted(set(space.thread_counts) | (set() if cfg.no_defaults else {defaults.threads}))
    def measure_fit() -> dict:
        if cfg.wait_quiet > 0:
            wait_for_quiet(cfg.wait_quiet, progress)
        return inprocess_fit(cfg.model, threads, space.max_batch_size, slo, cfg.fit_seconds, progress,
                             cfg.wait_quiet)

    fit = checkpoint.fit(measure_fit)
    service = ServiceModel.fit(FitPoint.from_json(p) for p in fit["points"])
    rates = cfg.search_settings.rates
    defaults_result = grid_results = judged = None
    with ServedMeasurer(cfg.model, store, config, cfg.load, progress=progress, wait_quiet_s=cfg.wait_quiet,
                        slo_ms=slo) as measurer:
        if not cfg.no_defaults:
            predicted = service.predict(defaults, slo)
            progress(f"TorchServe defaults: {defaults.label} (predicted {predicted.rate_rps:.1f} req/s)")
            defaults_result = evaluate(defaults, max(predicted.rate_rps, 1.0), slo, measurer.measure, checkpoint,
                                       "defaults", rates, predicted, measurer.finish)
            progress(f"TorchServe defaults: {defaults_result.throughput_rps:.1f} req/s within the SLO")
        result = search(space.candidates(), service, slo, measurer.measure, checkpoint, cfg.search_settings,
                        progress, measurer.finish, prior=(defaults_result,) if defaults_result else ())
        if cfg.grid:
            grid_results = grid(space.candidates(), slo, measurer.measure, checkpoint, progress=progress,
                                finish=measurer.finish)
            judged = head_to_head(result.chosen, best_of(grid_results), slo, measurer.measure, checkpoint,
                                  progress, measurer.finish)
    conditions = {"before": before, "after": machine_conditions(), "starts": measurer.conditions}
    environment = describe_environment()

    written, verification = write_and_verify(cfg, result, defaults_result, environment, archive, checkpoint,
                                             progress)
    report = build_report(cfg, fit, service, result, defaults_result, grid_results, conditions, environment,
                          written, verification, judged)
    tune_report.write(folder, report)
    print_summary(report, folder)
    if result.chosen is None:
        return 1
    return 0 if verification is None or verification.passed else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    # SIGTERM unwinds like Ctrl-C: every server is stopped and the checkpoint is already on disk.
    processes.sigterm_as_interrupt()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    try:
        configs = configs_from(args, argv)
    except (LauncherError, BuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    status = 0
    for cfg in configs:
        try:
            status = max(status, tune_model(cfg))
        except KeyboardInterrupt:
            print(f"\ninterrupted: resume with  .venv/bin/python -m benchmarks.tune --resume {cfg.folder}",
                  file=sys.stderr)
            return 130
        except (LauncherError, BuildError) as exc:  # tuner, launcher, benchmark, config, build errors
            print(f"error [{cfg.model}]: {exc}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
