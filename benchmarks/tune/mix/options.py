"""`python -m benchmarks tune --mix ...`: the command line read once into MixOptions."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from benchmarks.load import cli
from benchmarks.load.capacity import RateSettings
from benchmarks.load.mix import Mix
from benchmarks.load.stats import StabilityRule
from benchmarks.tune.errors import TuneError
from benchmarks.tune.mix.measure import PointSettings
from benchmarks.tune.mix.pipeline import MixOptions
from benchmarks.tune.mix.search import SearchSettings
from build.catalogue import Catalogue

# Options of the per-model tuner that mean nothing for a mix: refused rather than ignored.
_PER_MODEL_ONLY = ("model", "slo_ms", "resume", "workers", "no_defaults", "no_verify", "tie_pct")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("mix (one server for several models: python -m benchmarks tune --mix ...)")
    g.add_argument("--mix", metavar="MODEL=SHARE,...",
                   help="tune the whole server for this traffic mix (e.g. minilm=0.7,efficientnet_lite0=0.3); "
                        "each model keeps its catalogue slo_ms; cores are one budget for all")
    g.add_argument("--mix-candidates", type=int, default=8, help="servers the mix search measures at most")
    g.add_argument("--mix-search-requests", type=int, default=1000,
                   help="the search's points: arrivals of the least-shared model per point at least "
                        "(the reference and the verification use --point-requests)")
    g.add_argument("--mix-window-s", type=float, default=5.0, help="window length of every mixed point at least")
    g.add_argument("--mix-warmup-s", type=float, default=10.0,
                   help="the search: unmeasured load after each server start (the reference and the verification "
                        "use --verify-warmup-s)")


def mix_options(args: argparse.Namespace, parser: argparse.ArgumentParser, catalogue: Catalogue, cores: int,
                command: str) -> MixOptions:
    given = [name for name in _PER_MODEL_ONLY if getattr(args, name) != parser.get_default(name)]
    if given:
        flags = ", ".join("--" + n.replace("_", "-") for n in given)
        raise TuneError(f"{flags}: not options of a mix run (the mix names its models; each keeps its catalogue "
                        "slo_ms); drop them, or tune one model without --mix")
    if args.mix_candidates < 1 or args.mix_search_requests < 100 or args.point_requests < 100:
        raise TuneError("--mix-candidates must be >= 1, --mix-search-requests and --point-requests >= 100")
    if args.mix_window_s <= 0 or args.mix_warmup_s < 0 or args.verify_warmup_s < 0:
        raise TuneError("--mix-window-s must be > 0, --mix-warmup-s and --verify-warmup-s >= 0")
    mix = Mix.parse(args.mix, {n: catalogue.entry(n).slo_ms for n in catalogue.names})
    rates = RateSettings(step=args.rate_step, resolution=args.rate_resolution, max_points=args.max_points)
    search = SearchSettings(**{k: v for k, v in (("batch_sizes", args.batch_sizes), ("delays", args.delays))
                               if v}, max_candidates=args.mix_candidates, min_gain_pct=args.min_gain_pct)
    try:  # the load options' stability rule holds for the mix's points too
        rule = StabilityRule(tolerance_pct=args.stability_pct, last=args.stable_windows,
                             max_windows=max(args.max_windows, args.stable_windows))
    except ValueError as err:
        raise TuneError(f"stability rule: {err}") from None
    try:
        final_rule = replace(rule, tolerance_pct=args.verify_stability_pct)
    except ValueError as err:
        raise TuneError(f"--verify-stability-pct: {err}") from None
    search_point = PointSettings(point_requests=args.mix_search_requests, window_s=args.mix_window_s,
                                 rule=rule, warmup_s=args.mix_warmup_s, rates=rates)
    final_point = PointSettings(point_requests=args.point_requests, window_s=args.mix_window_s,
                                rule=final_rule, warmup_s=args.verify_warmup_s, rates=rates)
    folder = cli.report_folder(args.out, "tune-mix")
    return MixOptions(mix, cores, Path(args.config).resolve(), Path(args.model_store).resolve(), folder.resolve(),
                      search, search_point, final_point, not args.no_write, command)
