"""`python -m benchmarks bench`'s command line, read once into BenchConfig."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from benchmarks.load import cli
from benchmarks.load.capacity import REFERENCE_WINDOW_S
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.runner import LoadPlan
from benchmarks.load.stats import StabilityRule
from serving.errors import LauncherError
from serving.repo import CATALOGUE
from serving.ts_config import ModelSettings, ServerConfig

# The long form's open-loop rates, as fractions of the closed-loop peak.
FULL_FRACTIONS = (0.25, 0.5, 0.75, 0.9)
# The tail at low load is measured at this share of the capacity found.
LOW_LOAD_FRACTION = 0.25

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
    budget_s: Optional[float] = None  # the whole run's time budget (None: none)
    device: str = "cpu"  # where ours' workers and the in-process limit run (cuda: one GPU)


def parser() -> argparse.ArgumentParser:
    p = cli.parser("bench", "Benchmark one model on a real TorchServe: how fast is it served, and how far "
                            "from its limit?")
    cli.add(p, model={"required": True}, config={"help": "base config.properties for ours"})
    g = p.add_argument_group("our server (defaults: the config's models= entry for the model)")
    g.add_argument("--max-batch-delay", type=int, metavar="MS", help="TorchServe maxBatchDelay")
    cli.add(g, "batch_size", "workers", "threads",
            variant={"help": "the catalogue variant ours serves (default: the archive config.properties names, "
                             "i.e. what make tune chose; else the entry's default)"})
    g.add_argument("--compare-variant", action="append", default=[], metavar="VARIANT",
                   help="also serve this variant's archive with the same settings and load, same run (repeatable)")
    g = p.add_argument_group("load")
    g.add_argument("--concurrency", type=cli.numbers(int), metavar="N,N,...",
                   help="closed-loop levels, all run (default: 1; --full: sweep 1, 2, 4, ... until the gain is small)")
    g.add_argument("--max-concurrency", type=int, default=64, help="sweep limit (default: %(default)s)")
    g.add_argument("--rates", type=cli.numbers(float), metavar="R,R,...",
                   help="open-loop Poisson rates for ours, req/s (default: fractions of the peak)")
    g.add_argument("--rate-fractions", type=cli.numbers(float), metavar="F,F,...",
                   help="open-loop rates as fractions of each server's closed-loop peak (--full's default: "
                        "0.25,0.5,0.75,0.9; otherwise the search starts at half the in-process limit)")
    g.add_argument("--scout-requests", type=int, default=300,
                   help="capacity search: bracket the p99 target with short points of this many arrivals first "
                        "(never a capacity), then measure the bracket in full (0: every point in full; "
                        "default: %(default)s)")
    g.add_argument("--capacity-points", type=int, default=5,
                   help="open loop: up to this many more points bisect the highest rate within the p99 target, "
                        "as the tuner does (0: the listed rates only; default: %(default)s)")
    cli.add(g, "connections", "stable_windows", "wait_quiet", min_gain_pct={"default": 5.0},
            point_requests={"default": 1000}, window_s={"default": REFERENCE_WINDOW_S}, max_windows={"default": 8},
            stability_pct={"default": 10.0}, warmup_s={"default": 5.0})
    g = p.add_argument_group("references")
    cli.add(g, "slo_ms")
    g.add_argument("--inprocess-seconds", type=float, default=10.0,
                   help="in-process limit measuring time (default: %(default)s)")
    g.add_argument("--stock", action="store_true", help="also measure the stock baseline (TorchServe's defaults, "
                                                        "naive handlers) through the same load")
    g.add_argument("--stock-workers", type=int, help="stock workers (default: TorchServe's own, one per CPU)")
    g.add_argument("--ceiling", action="store_true",
                   help="also measure the no-op handler's ceiling (batch 1, 8 and ours) and the breakdown against it")
    cli.add(p, "device", "out", budget_min={"default": 10.0})
    p.add_argument("--full", action="store_true",
                   help="the long form: closed-loop sweep and open-loop fractions of its peak before the capacity "
                        "search, the stock baseline and the ceiling (tens of minutes)")
    p.add_argument("--smoke", action="store_true",
                   help="a short run for tests: 1 s windows, concurrency 1,4 (stock: 1), one open-loop rate")
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
    if args.budget_min < 0 or args.scout_requests < 0:
        raise BenchmarkError("--budget-min and --scout-requests must be >= 0 (0: none)")
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
        scout_requests=0 if args.smoke else args.scout_requests,
    )
    # The baseline always gets the long form's sweep and fractions of its own peak; its capacity is not
    # searched: it rarely meets the target at all, and its low rates are slow.
    stock_plan = replace(plan, rates=(), levels=(1,) if args.smoke else concurrency_levels(args.max_concurrency),
                         min_gain_pct=None if args.smoke else args.min_gain_pct,
                         rate_fractions=args.rate_fractions if args.smoke else fractions, capacity_points=0,
                         low_load_fraction=0.0, scout_requests=0)
    return BenchConfig(
        model=args.model, settings=settings, threads=args.threads, plan=plan, stock_plan=stock_plan,
        slo_ms=args.slo_ms or entry.slo_ms, base_config=Path(args.config).resolve(),
        inprocess_s=args.inprocess_seconds, stock=args.stock, stock_workers=args.stock_workers,
        ceiling=args.ceiling, variant=variant,
        compare=tuple(v for v in dict.fromkeys(args.compare_variant) if v != variant),
        out=args.out, smoke=args.smoke,
        command=cli.command_line("bench", argv),
        budget_s=60.0 * args.budget_min if args.budget_min else None, device=args.device,
    )
