"""Benchmark one model on a real TorchServe: how fast is it served, and how far from its limit?

    python -m benchmarks.bench --model <name>                  # minutes: the figures asked first
    python -m benchmarks.bench --model <name> --stock --ceiling   # + the references, same run
    python -m benchmarks.bench --model <name> --full           # the long form: sweep, fractions, both references
    make bench MODEL=<name> ARGS="--full"

A model whose family generates text (causal_lm) is measured by benchmarks/bench/generation.py:
tokens/s, time to first token and inter-token gaps instead of requests/s.

By default: (1) the in-process limit: our handler's batched throughput with no server, same batch
size and threads; (2) ours: a TorchServe on free loopback ports with the given per-model values,
one closed-loop client (p50/p99 of a request alone), then the served capacity at the SLO (open-loop
Poisson points from half the in-process limit, bisected as the tuner does) and a point at a quarter
of that capacity (the tail at low load). `--full` runs instead a closed-loop concurrency sweep
(1, 2, 4, ... until throughput rises by <5%) and open-loop points at fractions of its peak before
the search. `--stock` adds the stock baseline (naive handlers, TorchServe defaults) through the
same load; `--ceiling` the no-op handler's ceiling (benchmarks/bench/served_path.py). Each point
runs in windows until the stability rule holds. Servers are stopped on every exit path. Writes
benchmarks/reports/<model>-<time>/ (report.json, results.csv, report.md, PNG plots).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

from benchmarks.load.capacity import REFERENCE_WINDOW_S
from benchmarks.load.runner import LoadPlan, ServerRun
from benchmarks.load.stats import StabilityRule
from build.errors import BuildError
from serving.errors import BenchmarkError, LauncherError
from serving.launcher import TorchServe
from serving.repo import (
    CATALOGUE,
    DEFAULT_CONFIG,
    MODEL_STORE,
    REPO_ROOT,
    REPORTS,
    shown,
)
from serving.ts_config import ModelSettings, ServerConfig

# The benchmark reads /metrics: Prometheus format, and our handlers' counters picked up unannounced.
METRICS_PROPERTIES = {"metrics_mode": "prometheus", "model_metrics_auto_detect": "true"}
# Under TorchServe's defaults only the metrics format is changed.
STOCK_PROPERTIES = "metrics_mode=prometheus\n"
# The long form's open-loop rates, as fractions of the closed-loop peak.
FULL_FRACTIONS = (0.25, 0.5, 0.75, 0.9)
# The tail at low load is measured at this share of the capacity found.
LOW_LOAD_FRACTION = 0.25
# Without a sweep, the first open-loop rate: this share of the in-process limit (what a server can
# at best approach), from which the capacity search steps up or down.
START_FRACTION = 0.5


@dataclass(frozen=True)
class BenchConfig:
    model: str
    settings: ModelSettings  # ours: batch size, max batch delay, workers
    threads: Optional[int]  # intra-op threads per worker; None: as the archive says (auto: cores/workers)
    plan: LoadPlan
    stock_plan: LoadPlan  # open-loop rates always relative to the baseline's own peak
    slo_ms: float
    base_config: Path
    inprocess_s: float
    stock: bool
    stock_workers: Optional[int]  # None: TorchServe's default (one per CPU)
    ceiling: bool  # the no-op handler's ceiling (benchmarks/bench/served_path.py)
    variant: str  # the archive ours serves (build/variants.py): config.properties' marName unless --variant
    compare: tuple  # other variants served with the same settings and load, same run
    out: Path
    smoke: bool
    command: str


def _numbers(kind):
    def parse(text: str):
        try:
            values = tuple(kind(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
        return values
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a catalogue model (catalogue.yaml)")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                   help="base config.properties for ours (default: the repo's)")
    g = p.add_argument_group("our server (defaults: the config's models= entry for the model)")
    g.add_argument("--batch-size", type=int, help="TorchServe batchSize")
    g.add_argument("--max-batch-delay", type=int, metavar="MS", help="TorchServe maxBatchDelay")
    g.add_argument("--workers", type=int, help="minWorkers = maxWorkers")
    g.add_argument("--threads", type=int, help="intra-op threads per worker (default: the archive's setting)")
    g.add_argument("--variant", help="the catalogue variant ours serves (default: the archive config.properties "
                                     "names, i.e. what make tune chose; else the entry's default)")
    g.add_argument("--compare-variant", action="append", default=[], metavar="VARIANT",
                   help="also serve this variant's archive with the same settings and load, same run (repeatable)")
    g = p.add_argument_group("load")
    g.add_argument("--concurrency", type=_numbers(int), metavar="N,N,...",
                   help="closed-loop levels, all run (default: 1; --full: sweep 1, 2, 4, ... until the gain is small)")
    g.add_argument("--max-concurrency", type=int, default=64, help="sweep limit (default: %(default)s)")
    g.add_argument("--min-gain-pct", type=float, default=5.0,
                   help="the sweep stops when throughput rises by less (default: %(default)s)")
    g.add_argument("--rates", type=_numbers(float), metavar="R,R,...",
                   help="open-loop Poisson rates for ours, req/s (default: fractions of the peak)")
    g.add_argument("--rate-fractions", type=_numbers(float), metavar="F,F,...",
                   help="open-loop rates as fractions of each server's closed-loop peak (--full's default: "
                        "0.25,0.5,0.75,0.9; otherwise the search starts at half the in-process limit)")
    g.add_argument("--connections", type=int, default=64,
                   help="open loop: concurrent connections at most (default: %(default)s)")
    g.add_argument("--point-requests", type=int, default=2000,
                   help="open loop: arrivals per point at least, over its reported windows (default: %(default)s)")
    g.add_argument("--capacity-points", type=int, default=5,
                   help="open loop: up to this many more points bisect the highest rate within the p99 target, "
                        "as the tuner does (0: the listed rates only; default: %(default)s)")
    g.add_argument("--window-s", type=float, default=REFERENCE_WINDOW_S,
                   help="measurement window (default: %(default)s)")
    g.add_argument("--max-windows", type=int, default=8,
                   help="measured windows per point at most (default: %(default)s)")
    g.add_argument("--stability-pct", type=float, default=10.0,
                   help="stable: throughput and p99 of the last windows within this %% (default: %(default)s)")
    g.add_argument("--stable-windows", type=int, default=3, help="how many last windows (default: %(default)s)")
    g.add_argument("--warmup-s", type=float, default=5.0,
                   help="unmeasured load after each server starts (default: %(default)s)")
    g.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="before each phase, wait (at most this long) for no other TorchServe and an idle CPU; "
                        "a point during which other processes were busy is measured again (default: don't)")
    g = p.add_argument_group("references")
    g.add_argument("--slo-ms", type=float, help="p99 target (default: the catalogue's slo_ms)")
    g.add_argument("--inprocess-seconds", type=float, default=10.0,
                   help="in-process limit measuring time (default: %(default)s)")
    g.add_argument("--stock", action="store_true", help="also measure the stock baseline (TorchServe's defaults, "
                                                        "naive handlers) through the same load")
    g.add_argument("--stock-workers", type=int, help="stock workers (default: TorchServe's own, one per CPU)")
    g.add_argument("--ceiling", action="store_true",
                   help="also measure the no-op handler's ceiling (batch 1, 8 and ours) and the breakdown against it")
    p.add_argument("--full", action="store_true",
                   help="the long form: closed-loop sweep and open-loop fractions of its peak before the capacity "
                        "search, the stock baseline and the ceiling (tens of minutes)")
    p.add_argument("--smoke", action="store_true",
                   help="a short run for tests: 1 s windows, concurrency 1,4 (stock: 1), one open-loop rate")
    p.add_argument("--out", type=Path, default=REPORTS, help="reports folder (default: benchmarks/reports)")
    return p


def config_from(args: argparse.Namespace, argv: Sequence[str]) -> BenchConfig:
    from build.catalogue import Catalogue

    catalogue = Catalogue.load(CATALOGUE)
    entry = catalogue.entry(args.model)
    try:
        written = ServerConfig.load(args.config).model(args.model)
        base, archive = written.settings, written.archive
    except LauncherError:
        base, archive = ModelSettings(), ""
    by_archive = {v.archive_name(args.model): v.name for v in entry.variants}
    variant = args.variant or by_archive.get(archive, entry.default_variant.name)
    for name in (variant, *args.compare_variant):
        if name not in {v.name for v in entry.variants}:
            raise BenchmarkError(f"{args.model} has no variant {name!r} (catalogue: "
                                 f"{', '.join(v.name for v in entry.variants)})")
    workers = args.workers or base.min_workers
    settings = ModelSettings(
        batch_size=args.batch_size or base.batch_size,
        max_batch_delay_ms=base.max_batch_delay_ms if args.max_batch_delay is None else args.max_batch_delay,
        min_workers=workers, max_workers=workers, response_timeout_s=base.response_timeout_s,
        # The written thread plan holds for the written workers only; other counts use the handler's fallback.
        threads=base.threads if workers == base.min_workers else None,
    )
    for name in ("window_s", "max_windows", "stable_windows", "max_concurrency", "connections", "inprocess_seconds"):
        if getattr(args, name) <= 0:
            raise BenchmarkError(f"--{name.replace('_', '-')} must be > 0")
    if args.capacity_points < 0:
        raise BenchmarkError("--capacity-points must be >= 0")
    if args.rate_fractions and not (args.full or args.concurrency or args.smoke):
        raise BenchmarkError("--rate-fractions are fractions of the closed-loop sweep's peak: add --full (or "
                             "--concurrency N,N,...), or give absolute --rates")
    fractions = args.rate_fractions or FULL_FRACTIONS
    if args.full:
        args.stock = args.ceiling = True
        args.rate_fractions = fractions
    if args.smoke:
        args.capacity_points = 0
        args.window_s, args.max_windows, args.stable_windows = 1.0, 3, 3
        args.concurrency, args.rate_fractions = args.concurrency or (1, 4), (0.5,)
        args.inprocess_seconds, args.warmup_s = min(args.inprocess_seconds, 2.0), 2.0
    # Without a sweep there is no peak to take fractions of: the search starts from the in-process limit.
    sweep = args.full or bool(args.concurrency)
    try:
        rule = StabilityRule(tolerance_pct=args.stability_pct, last=args.stable_windows,
                             max_windows=max(args.max_windows, args.stable_windows))
    except ValueError as err:
        raise BenchmarkError(f"stability rule: {err}") from None
    from benchmarks.load.loadgen import concurrency_levels

    plan = LoadPlan(
        levels=args.concurrency or (concurrency_levels(args.max_concurrency) if args.full else (1,)),
        min_gain_pct=args.min_gain_pct if args.full and not args.concurrency else None,
        rates=args.rates or (), rate_fractions=(args.rate_fractions or ()) if sweep or args.rates else (),
        rule=rule, window_s=args.window_s,
        connections=args.connections, warmup_s=args.warmup_s, min_window_requests=0 if args.smoke else 20,
        point_requests=0 if args.smoke else args.point_requests,
        wait_quiet_s=args.wait_quiet, capacity_points=args.capacity_points, slo_ms=args.slo_ms or entry.slo_ms,
        low_load_fraction=LOW_LOAD_FRACTION if args.capacity_points else 0.0,
    )
    # The baseline always gets the long form's sweep and fractions of its own peak; its capacity is not
    # searched: it rarely meets the target at all, and its low rates are slow.
    stock_plan = replace(plan, rates=(), levels=(1,) if args.smoke else concurrency_levels(args.max_concurrency),
                         min_gain_pct=None if args.smoke else args.min_gain_pct,
                         rate_fractions=args.rate_fractions if args.smoke else fractions, capacity_points=0,
                         low_load_fraction=0.0)
    return BenchConfig(
        model=args.model, settings=settings, threads=args.threads, plan=plan, stock_plan=stock_plan,
        slo_ms=args.slo_ms or entry.slo_ms, base_config=Path(args.config).resolve(),
        inprocess_s=args.inprocess_seconds, stock=args.stock, stock_workers=args.stock_workers,
        ceiling=args.ceiling, variant=variant,
        compare=tuple(v for v in dict.fromkeys(args.compare_variant) if v != variant),
        out=args.out, smoke=args.smoke,
        command=shlex.join([".venv/bin/python", "-m", "benchmarks.bench", *argv]),
    )


# -- steps ------------------------------------------------------------------------------------
def progress(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)


def our_store(cfg: BenchConfig, tmp: Path) -> Path:
    """model_store/ (rebuilt if its inputs changed), or an archive built with --threads."""
    from build.archive import build_entry
    from build.catalogue import Catalogue

    catalogue = Catalogue.load(CATALOGUE)
    store = MODEL_STORE
    if cfg.threads is not None:
        raw = dict(catalogue.raw_entries[cfg.model])
        settings = dict(raw.get("settings") or {})
        settings["runtime"] = {**(settings.get("runtime") or {}), "threads": cfg.threads}
        catalogue = Catalogue(catalogue.path, {cfg.model: {**raw, "settings": settings}})
        store = tmp / "store"
    result = build_entry(catalogue, cfg.model, REPO_ROOT, store, progress=progress)
    return result.archive.parent


def resolved_threads(cfg: BenchConfig) -> int:
    """The intra-op threads each of our workers uses (the handler's own rule)."""
    from build.catalogue import Catalogue
    from handlers import runtime
    from handlers.settings import RuntimeSettings, parse_section

    raw = dict(Catalogue.load(CATALOGUE).entry(cfg.model).settings.get("runtime") or {})
    settings = parse_section(RuntimeSettings, {**raw, "threads": cfg.threads} if cfg.threads else raw, "runtime")
    threads, _ = runtime.thread_budget(settings, cfg.settings.threads, cfg.settings.max_workers, runtime.usable_cores())
    return threads


def inprocess_limit(cfg: BenchConfig, threads: int, tmp: Path) -> dict:
    """Our handler's batched throughput in this process, no server; measured again (after a wait
    for a quiet machine, with --wait-quiet) when other processes were busy meanwhile."""
    from benchmarks.bench.inprocess import extracted_archive, run_variant
    from benchmarks.load import resources

    progress(f"[in-process] {cfg.model}: batch {cfg.settings.batch_size}, {threads} threads, "
             f"{cfg.inprocess_s:g} s")
    model_dir = extracted_archive(cfg.model, cfg.variant, tmp)
    me = resources.ProcessGroups({resources.GENERATOR: [os.getpid()]})
    for attempt in (1, 2):
        before = me.read()
        row = run_variant(cfg.model, model_dir, {}, cfg.settings.batch_size, threads, cfg.inprocess_s)
        others = resources.usage(before, me.read())[resources.OTHERS].cpu_pct
        progress(f"[in-process] {row.items_per_s:.1f} items/s (other processes: {others:.0f}% of a core)")
        if attempt == 2 or cfg.plan.wait_quiet_s <= 0 or others <= resources.NOISY_OTHERS_PCT:
            break
        progress("[in-process] other processes were busy: measuring again when quiet")
        resources.wait_for_quiet(cfg.plan.wait_quiet_s, progress)
    # One request alone: what a request on an idle server cannot go below (benchmarks/bench/targets.py).
    single = run_variant(cfg.model, model_dir, {}, 1, threads, min(cfg.inprocess_s, 5.0))
    progress(f"[in-process] batch 1: {1000.0 / single.items_per_s:.2f} ms")
    # One process per worker, each on its own cores: the served ceiling is the workers' sum.
    workers = cfg.settings.min_workers
    return {"items_per_s": row.items_per_s * workers, "per_worker_items_per_s": row.items_per_s,
            "batch1_ms": 1000.0 / single.items_per_s,
            "workers": workers, "batch_size": cfg.settings.batch_size, "threads": threads,
            "batches": row.batches, "seconds": row.seconds, "stage_ms_per_batch": row.stage_ms_per_batch,
            "others_cpu_pct": round(others, 1), "remeasured": attempt == 2}


def run_ours(cfg: BenchConfig, store: Path, variant: Optional[str] = None, label: str = "ours") -> ServerRun:
    """Our handler on a TorchServe with cfg's settings (and load plan), serving `variant`'s archive
    (default: cfg's)."""
    from benchmarks.load.runner import run_server
    from build.catalogue import Catalogue

    entry = Catalogue.load(CATALOGUE).entry(cfg.model)
    archive = next(v for v in entry.variants if v.name == (variant or cfg.variant)).archive_name(cfg.model)
    if not (store / archive).is_file():
        raise BenchmarkError(f"{archive} is not archived: the build's accuracy gate rejected it "
                             "(model_store/build_report.md)")
    progress(f"[{label}] starting TorchServe: {cfg.settings}, archive {archive}")
    with TorchServe(store, base_config=cfg.base_config, models={cfg.model: cfg.settings}, load=(cfg.model,),
                    archives={cfg.model: archive}, extra_properties=METRICS_PROPERTIES) as ts:
        return run_server(label, ts, cfg.model, cfg.plan, progress)


def run_stock(cfg: BenchConfig, tmp: Path) -> ServerRun:
    from benchmarks.bench.baseline.archive import build_baseline
    from benchmarks.load.runner import run_server

    store = tmp / "stock-store"
    progress(f"[stock] packaging the naive handler into {store}")
    build_baseline(cfg.model, store)
    base = tmp / "stock.properties"
    base.write_text(STOCK_PROPERTIES)
    if cfg.stock_workers:
        extra = {}
        models = {cfg.model: ModelSettings(min_workers=cfg.stock_workers, max_workers=cfg.stock_workers)}
    else:
        extra, models = {"models": "{}"}, {}  # no per-model values at all: TorchServe's defaults
    progress("[stock] starting TorchServe with its defaults")
    with TorchServe(store, base_config=base, models=models, load=(cfg.model,), extra_properties=extra) as ts:
        return run_server("stock", ts, cfg.model, cfg.stock_plan, progress)


def run(cfg: BenchConfig) -> Path:
    from benchmarks.bench import report
    from benchmarks.bench.baseline.archive import NoBaseline
    from benchmarks.load import resources

    waits = {}

    def quiet(phase: str) -> None:
        if cfg.plan.wait_quiet_s > 0:
            waits[phase] = resources.wait_for_quiet(cfg.plan.wait_quiet_s, progress)

    before = resources.machine_conditions()
    if before["other_torchserve_pids"]:
        progress(f"other TorchServe running (pids {before['other_torchserve_pids']}): numbers may be noisy")
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp_name:
        tmp = Path(tmp_name)
        store = our_store(cfg, tmp)
        threads = resolved_threads(cfg)
        quiet("inprocess")
        limit = inprocess_limit(cfg, threads, tmp)
        ceiling = {}
        if cfg.ceiling:
            from benchmarks.bench.served_path import measure_ceiling

            quiet("ceiling")
            ceiling = measure_ceiling(cfg.model, cfg.settings, cfg.plan, cfg.base_config, METRICS_PROPERTIES,
                                      tmp, progress)
        if not cfg.plan.rates and not cfg.plan.rate_fractions:
            cfg = replace(cfg, plan=replace(cfg.plan, rates=(round(START_FRACTION * limit["items_per_s"], 1),)))
        quiet("ours")
        runs = {"ours": run_ours(cfg, store)}
        for variant in cfg.compare:
            quiet(variant)
            runs[f"variant {variant}"] = run_ours(cfg, store, variant, f"variant {variant}")
        no_stock = None if cfg.stock else "not asked for (--stock)"
        if cfg.stock:
            quiet("stock")
            try:
                runs["stock"] = run_stock(cfg, tmp)
            except NoBaseline as why:
                no_stock = str(why)
                progress(f"[stock] {why}: compared with the in-process limit only")
    after = resources.machine_conditions()
    configuration = {
        "model": cfg.model, "base_config": shown(cfg.base_config), "slo_ms": cfg.slo_ms, "smoke": cfg.smoke,
        "ours": {**asdict(cfg.settings), "threads_requested": cfg.threads, "threads_resolved": threads,
                 "variant": cfg.variant},
        "compared_variants": list(cfg.compare),
        "stock": {"handler": "benchmarks/bench/baseline (eager fp32, per-request PIL/tokenizer, pad to 128)",
                  "properties": STOCK_PROPERTIES.strip(), "workers_requested": cfg.stock_workers,
                  "missing": no_stock},
    }
    load = {"ours": cfg.plan.to_json(), "stock": cfg.stock_plan.to_json()}
    return report.write(cfg.out, cfg.model, configuration=configuration, load=load, runs=runs, inprocess=limit,
                        ceiling=ceiling,
                        conditions={"before": before, "after": after, "waits": waits,
                                    "seconds": round(time.time() - started)},
                        command=cfg.command, slo_ms=cfg.slo_ms, smoke=cfg.smoke)


def generating_model(argv: Sequence[str]) -> Optional[str]:
    """The --model of argv when its family generates text (benchmarks/bench/generation.py measures it)."""
    from build.catalogue import Catalogue

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--model")
    model = pre.parse_known_args(argv)[0].model
    return model if model in Catalogue.load(CATALOGUE).names_of(generating=True) else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if generating_model(argv):
        from benchmarks.bench import generation

        return generation.main(argv)
    args = parser().parse_args(argv)
    try:
        cfg = config_from(args, argv)
        folder = run(cfg)
    except KeyboardInterrupt:
        progress("interrupted: servers stopped")
        return 130
    except (LauncherError, BenchmarkError, BuildError) as err:
        progress(f"error: {err}")
        return 2
    summary = json.loads((folder / "report.json").read_text())["summary"]
    print("\n".join(summary["sentences"]))
    print(f"report: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
