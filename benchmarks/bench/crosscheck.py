"""Check the benchmark's open-loop figures against an independent client, wrk2, on one server.

    python -m benchmarks.bench.crosscheck --model minilm --capacity 250 --wrk /path/to/wrk2/wrk

One TorchServe with the shipped config's values for the model. At three rates (shares of
`--capacity`, the benchmark's capacity at the SLO) over the same connections: wrk2 (constant rate,
each connection paced on its own) and our generator (Poisson arrivals). Then, at the lowest rate,
both clients over 1, 4, 16 and `--connections` connections, ours replaying wrk2's schedule
(benchmarks/load/arrivals.py), which tells the arrival pattern apart from the client: where the
two clients agree on one schedule, a gap between schedules is the load's, not a client's error.
The low-load tail target: wrk2's p99 at the lowest rate over >= 16 connections <= 2x its p99 over
one connection. Each point: `--seconds` measured (wrk2's calibration and our first window are
not). Writes benchmarks/reports/crosscheck-<model>-<time>/ (report.json, report.md, crosscheck.png,
and wrk2/ with each wrk2 run's output as printed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from benchmarks.bench.crosscheck_report import judge, markdown, plot
from benchmarks.load import traffic, wrk2
from benchmarks.load.arrivals import per_connection_schedule
from benchmarks.load.loadgen import open_loop
from benchmarks.load.runner import warm_up
from serving.errors import BenchmarkError, LauncherError
from serving.launcher import TorchServe
from serving.repo import DEFAULT_CONFIG, MODEL_STORE, REPORTS, shown
from serving.ts_config import ModelSettings, ServerConfig


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} [crosscheck] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class CrossCheckConfig:
    model: str
    capacity_rps: float
    fractions: tuple[float, ...]
    connections: int
    threads: int
    seconds: float
    sweep: tuple[int, ...]  # connections tried at the lowest rate
    wrk: Path
    out: Path
    command: str
    settings: Optional[ModelSettings] = None  # None: the shipped config's values

    @property
    def rates(self) -> tuple[float, ...]:
        """Whole req/s: wrk2's -R takes an integer."""
        return tuple(float(max(1, round(f * self.capacity_rps))) for f in self.fractions)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench.crosscheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--capacity", type=float, required=True, help="req/s: the benchmark's capacity at the SLO")
    p.add_argument("--fractions", default="0.25,0.5,0.9", help="shares of --capacity to measure at (default %(default)s)")
    p.add_argument("--connections", type=int, default=32, help="connections of both clients (default %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="wrk2's threads (default %(default)s, the cores)")
    p.add_argument("--seconds", type=float, default=30.0, help="measured seconds per point (default %(default)s)")
    p.add_argument("--workers", type=int, default=None, help="workers instead of the shipped config's")
    p.add_argument("--batch-size", type=int, default=None, help="batchSize instead of the shipped config's")
    p.add_argument("--wrk", default=None, help="wrk2's binary (default: $WRK2, else wrk on PATH)")
    p.add_argument("--out", default=None, help="report folder (default benchmarks/reports/crosscheck-<model>-<time>)")
    return p


def config_from(args: argparse.Namespace, argv: Sequence[str]) -> CrossCheckConfig:
    try:
        fractions = tuple(float(f) for f in args.fractions.split(","))
    except ValueError as err:
        raise BenchmarkError(f"--fractions: {args.fractions!r} is not a comma-separated list of numbers") from err
    if not fractions or any(not 0 < f <= 1.5 for f in fractions):
        raise BenchmarkError(f"--fractions: each share must be in (0, 1.5], got {args.fractions!r}")
    if args.capacity <= 0:
        raise BenchmarkError(f"--capacity must be > 0 req/s, got {args.capacity}")
    if args.connections < 16:
        raise BenchmarkError(f"--connections must be >= 16 (the low-load tail target's), got {args.connections}")
    if args.threads < 1 or args.seconds < 5:
        raise BenchmarkError("--threads must be >= 1 and --seconds >= 5")
    out = Path(args.out) if args.out else REPORTS / f"crosscheck-{args.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    sweep = tuple(sorted({1, 4, 16, args.connections}))
    return CrossCheckConfig(args.model, args.capacity, tuple(sorted(fractions)), args.connections, args.threads,
                            args.seconds, sweep, wrk2.executable(args.wrk), out,
                            "python -m benchmarks.bench.crosscheck " + " ".join(without_paths(argv)),
                            overridden(args.model, args.workers, args.batch_size))


def without_paths(argv: Sequence[str]) -> list[str]:
    """argv as a report records it: wrk2's binary as `<wrk2>`, not a path of the machine that ran it."""
    out, hide = [], False
    for arg in argv:
        if hide:
            out.append("<wrk2>")
        elif arg.startswith("--wrk="):
            arg = "--wrk=<wrk2>"
        if not hide:
            out.append(arg)
        hide = arg == "--wrk"
    return out


def overridden(model: str, workers: Optional[int], batch_size: Optional[int]) -> Optional[ModelSettings]:
    """The shipped config's values for `model` with --workers / --batch-size in their place."""
    if workers is None and batch_size is None:
        return None
    if (workers is not None and workers < 1) or (batch_size is not None and batch_size < 1):
        raise BenchmarkError("--workers and --batch-size must be >= 1")
    shipped = ServerConfig.load(DEFAULT_CONFIG).model(model).settings
    changes = {"batch_size": batch_size} if batch_size is not None else {}
    if workers is not None:
        changes.update(min_workers=workers, max_workers=workers)
    return replace(shipped, **changes)


def _ours(target, payloads, rate: float, connections: int, seconds: float, arrivals=None) -> dict:
    window = seconds / 3
    result = open_loop(target, payloads, rate, traffic.fixed_windows(3, warmup=1), window, connections=connections,
                       progress=lambda line: None, arrivals=arrivals)
    f = result.figures()
    latency = f["latency_ms"] or {}
    return {"rate_rps": rate, "connections": connections, "requests": f["requests"],
            "throughput_rps": round(f["throughput_rps"], 1), "p50_ms": latency.get("p50_ms"),
            "p90_ms": latency.get("p90_ms"), "p99_ms": latency.get("p99_ms"),
            "errors": sum(f["errors"].values()) + f["unanswered"]}


def measure(cfg: CrossCheckConfig) -> dict:
    low = cfg.rates[0]
    rates, sweep = [], []
    models = {} if cfg.settings is None else {cfg.model: cfg.settings}
    with TorchServe(MODEL_STORE, load=(cfg.model,), models=models) as ts, tempfile.TemporaryDirectory(prefix="wrk2-") as tmp:
        target = traffic.target(ts, cfg.model)
        payloads = traffic.payloads(cfg.model)
        lua = wrk2.script(Path(tmp), target, payloads)
        settings = ts.describe(cfg.model)
        (cfg.out / "wrk2").mkdir(parents=True, exist_ok=True)
        log(f"{cfg.model}: warming up")
        warm_up(target, payloads, 5.0, 4)

        def wrk(rate: float, connections: int) -> dict:
            log(f"wrk2 {rate:g} req/s over {connections} connection(s)")
            keep = cfg.out / "wrk2" / f"{rate:g}rps-c{connections}.txt"
            return wrk2.run(cfg.wrk, lua, target, rate, connections, cfg.threads, cfg.seconds, keep).to_json()

        def ours(rate: float, connections: int, schedule: bool) -> dict:
            arrivals = per_connection_schedule(rate, connections, cfg.threads) if schedule else None
            log(f"ours {rate:g} req/s over {connections} connection(s), {'wrk2' if schedule else 'Poisson'} schedule")
            return _ours(target, payloads, rate, connections, cfg.seconds, arrivals)

        for rate in cfg.rates:
            rates.append({"rate_rps": rate, "wrk2": wrk(rate, cfg.connections),
                          "ours_poisson": ours(rate, cfg.connections, schedule=False),
                          "ours_wrk2_schedule": ours(rate, cfg.connections, schedule=True)})
        for connections in cfg.sweep:
            if connections == cfg.connections:
                by_wrk, replayed = rates[0]["wrk2"], rates[0]["ours_wrk2_schedule"]
            else:
                by_wrk, replayed = wrk(low, connections), ours(low, connections, True)
            sweep.append({"connections": connections, "wrk2": by_wrk, "ours_wrk2_schedule": replayed})
    return {"model": cfg.model, "capacity_rps": cfg.capacity_rps, "fractions": list(cfg.fractions),
            "connections": cfg.connections, "threads": cfg.threads, "seconds": cfg.seconds,
            "overridden": cfg.settings is not None,
            "served_values": {k: settings.get(k) for k in ("batchSize", "maxBatchDelay", "minWorkers")},
            "rates": rates, "sweep": sweep,
            "command": cfg.command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    try:
        cfg = config_from(args, argv)
        found = judge(measure(cfg))
    except KeyboardInterrupt:
        log("interrupted: server stopped")
        return 130
    except (BenchmarkError, LauncherError) as err:
        log(f"error: {err}")
        return 2
    cfg.out.mkdir(parents=True, exist_ok=True)
    (cfg.out / "report.json").write_text(json.dumps(found, indent=2) + "\n")
    plot(cfg.out / "crosscheck.png", found)
    (cfg.out / "report.md").write_text(markdown(found))
    print(f"report: {shown(cfg.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
