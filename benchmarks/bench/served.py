"""Benchmark one model on a real TorchServe: how fast is it served, and how far from its limit?

    python -m benchmarks bench --model <name>                  # minutes: the figures asked first
    python -m benchmarks bench --model <name> --stock --ceiling   # + the references, same run
    python -m benchmarks bench --model <name> --full           # the long form: sweep, fractions, both references
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
same load; `--ceiling` the no-op handler's ceiling (benchmarks/bench/served_path.py);
`--compare-variant` another archive of the model under the same settings and load. Each point
runs in windows until the stability rule holds. Servers are stopped on every exit path. Writes
benchmarks/reports/<model>-<time>/ (report.json, results.csv, report.md, PNG plots).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Optional

from benchmarks.bench.options import BenchConfig, config_from, parser
from benchmarks.load import cli
from benchmarks.load.budget import Budget
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.runner import ServerRun
from serving.launcher import TorchServe
from serving.repo import (
    CATALOGUE,
    MODEL_STORE,
    REPO_ROOT,
    shown,
)
from serving.ts_config import ModelSettings, device_properties

# The benchmark reads /metrics: Prometheus format, and our handlers' counters picked up unannounced.
METRICS_PROPERTIES = {"metrics_mode": "prometheus", "model_metrics_auto_detect": "true"}
# Under TorchServe's defaults only the metrics format is changed.
STOCK_PROPERTIES = "metrics_mode=prometheus\n"
# Without a sweep, the first open-loop rate: this share of the in-process limit (what a server can
# at best approach), from which the capacity search steps up or down.
START_FRACTION = 0.5


# -- steps ------------------------------------------------------------------------------------
progress = cli.progress()


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
        row = run_variant(cfg.model, model_dir, {}, cfg.settings.batch_size, threads, cfg.inprocess_s, cfg.device)
        others = resources.usage(before, me.read())[resources.OTHERS].cpu_pct
        progress(f"[in-process] {row.items_per_s:.1f} items/s (other processes: {others:.0f}% of a core)")
        if attempt == 2 or cfg.plan.wait_quiet_s <= 0 or others <= resources.NOISY_OTHERS_PCT:
            break
        progress("[in-process] other processes were busy: measuring again when quiet")
        resources.wait_for_quiet(cfg.plan.wait_quiet_s, progress)
    # One request alone: what a request on an idle server cannot go below (benchmarks/bench/targets.py).
    single = run_variant(cfg.model, model_dir, {}, 1, threads, min(cfg.inprocess_s, 5.0), cfg.device)
    progress(f"[in-process] batch 1: {1000.0 / single.items_per_s:.2f} ms")
    # One process per worker, each on its own cores: the served ceiling is the workers' sum.
    workers = cfg.settings.min_workers
    return {"items_per_s": row.items_per_s * workers, "per_worker_items_per_s": row.items_per_s,
            "batch1_ms": 1000.0 / single.items_per_s,
            "workers": workers, "batch_size": cfg.settings.batch_size, "threads": threads,
            "batches": row.batches, "seconds": row.seconds, "stage_ms_per_batch": row.stage_ms_per_batch,
            "others_cpu_pct": round(others, 1), "remeasured": attempt == 2}


def run_ours(cfg: BenchConfig, store: Path, variant: Optional[str] = None, label: str = "ours",
             budget: Optional[Budget] = None) -> ServerRun:
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
                    archives={cfg.model: archive},
                    extra_properties={**METRICS_PROPERTIES, **device_properties(cfg.device)}) as ts:
        return run_server(label, ts, cfg.model, cfg.plan, progress, budget)


def run_stock(cfg: BenchConfig, tmp: Path, budget: Optional[Budget] = None) -> ServerRun:
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
        return run_server("stock", ts, cfg.model, cfg.stock_plan, progress, budget)


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
    budget = Budget(cfg.budget_s)
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
                                      tmp, progress, only_ours=cfg.smoke)
        if not cfg.plan.rates and not cfg.plan.rate_fractions:
            cfg = replace(cfg, plan=replace(cfg.plan, rates=(round(START_FRACTION * limit["items_per_s"], 1),)))
        quiet("ours")
        runs = {"ours": run_ours(cfg, store, budget=budget)}
        for variant in cfg.compare:
            quiet(variant)
            runs[f"variant {variant}"] = run_ours(cfg, store, variant, f"variant {variant}", budget)
        no_stock = None if cfg.stock else "not asked for (--stock)"
        if cfg.stock:
            quiet("stock")
            try:
                runs["stock"] = run_stock(cfg, tmp, budget)
            except NoBaseline as why:
                no_stock = str(why)
                progress(f"[stock] {why}: compared with the in-process limit only")
    after = resources.machine_conditions()
    configuration = {
        "model": cfg.model, "base_config": shown(cfg.base_config), "slo_ms": cfg.slo_ms, "smoke": cfg.smoke,
        "ours": {**asdict(cfg.settings), "threads_requested": cfg.threads, "threads_resolved": threads,
                 "variant": cfg.variant, "device": cfg.device},
        "compared_variants": list(cfg.compare),
        "stock": {"handler": "benchmarks/bench/baseline (eager fp32, per-request PIL/tokenizer, pad to 128)",
                  "properties": STOCK_PROPERTIES.strip(), "workers_requested": cfg.stock_workers,
                  "missing": no_stock},
    }
    load = {"ours": cfg.plan.to_json(), "stock": cfg.stock_plan.to_json()}
    return report.write(cfg.out, cfg.model, configuration=configuration, load=load, runs=runs, inprocess=limit,
                        ceiling=ceiling,
                        conditions={"before": before, "after": after, "waits": waits,
                                    "seconds": round(time.time() - started), "budget": budget.to_json()},
                        command=cfg.command, slo_ms=cfg.slo_ms, smoke=cfg.smoke)


def generating_model(argv: Sequence[str]) -> Optional[str]:
    """The --model of argv when its family generates text (benchmarks/bench/generation.py measures it)."""
    from build.catalogue import Catalogue

    pre = argparse.ArgumentParser(add_help=False)
    cli.add(pre, "model")
    model = pre.parse_known_args(argv)[0].model
    return model if model in Catalogue.load(CATALOGUE).names_of(generating=True) else None


def main(argv: Sequence[str]) -> int:
    if generating_model(argv):
        from benchmarks.bench import generation

        return generation.main(argv)
    args = parser().parse_args(argv)
    folder = run(config_from(args, argv))
    summary = json.loads((folder / "report.json").read_text())["summary"]
    print("\n".join(summary["sentences"]))
    print(f"report: {folder}")
    return 0
