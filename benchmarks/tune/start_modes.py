"""Does the tuned plan hold however TorchServe is started? One mixed open-loop load, each start.

    python -m benchmarks.tune.start_modes [--rates <model>=<req/s>,...] [--seconds 60]

Each mode starts the shipped config.properties from a folder laid out like the repository root,
with the command a user types there, then offers the same Poisson mix for the same time. The
`oversubscribed` row is the reference: every worker takes the cores as if its model were alone
(what a worker without the server's plan used to take), written into a copy of the config.
Writes benchmarks/reports/start-modes-<time>/ (report.json, report.md, latency.png).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from benchmarks.load import loadgen, resources, runner, stats
from benchmarks.load.mix import Mix, MixPoint, mixed_payloads
from benchmarks.load.stats import StabilityRule
from benchmarks.tune.config_writer import Update, write_config
from build.catalogue import Catalogue
from handlers.frontend import CONFIG_ENV
from handlers.runtime import usable_cores
from serving.launcher import StartCommand, TorchServe
from serving.mix_record import read_mix
from serving.repo import CATALOGUE, DEFAULT_CONFIG, MODEL_STORE, REPORTS, shown
from serving.ts_config import ServerConfig

WARMUP_WINDOWS = 1


@dataclass(frozen=True)
class Mode:
    name: str
    command: StartCommand
    env: Mapping[str, str]
    oversubscribed: bool = False

    @property
    def shown(self) -> str:
        prefix = "".join(f"{k}={v} " for k, v in self.env.items())
        return prefix + self.command.shell() + (" (every worker: cores / its own workers)" if self.oversubscribed else "")


MODES = {m.name: m for m in (
    Mode("plain", StartCommand.PLAIN, {}),
    Mode("plain-ncs", StartCommand.PLAIN_NCS, {}),
    Mode("plain-ncs-env", StartCommand.PLAIN_NCS, {CONFIG_ENV: "config.properties"}),
    Mode("ts-config", StartCommand.TS_CONFIG, {}),
    Mode("oversubscribed", StartCommand.PLAIN_NCS, {}, oversubscribed=True),
)}


def parse_rates(text: str) -> dict[str, float]:
    rates = {}
    for part in (p for p in text.split(",") if p.strip()):
        name, _, value = part.partition("=")
        try:
            rates[name.strip()] = float(value)
        except ValueError:
            raise SystemExit(f"--rates: {part!r} is not <model>=<req/s>") from None
        if rates[name.strip()] <= 0:
            raise SystemExit(f"--rates: {name.strip()}'s rate must be > 0")
    return rates


def default_rates(config: Path, fraction: float) -> dict[str, float]:
    """`fraction` of each model's rate at the capacity the config's mix record measured."""
    record = read_mix(config)
    if record is None:
        raise SystemExit(f"{shown(config)} has no mix record (make tune MIX=...): give --rates <model>=<req/s>,...")
    return {m.name: round(fraction * m.rate_rps, 1) for m in record.models}


def oversubscribed_config(source: Path, folder: Path) -> Path:
    """A copy whose plan gives each model's workers all the cores, as if no other model ran."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.properties"
    config.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    cores = usable_cores()
    updates = []
    for entry in ServerConfig.load(config).models:
        alone = max(1, cores // max(1, entry.settings.min_workers))
        updates.append(Update(entry.name, entry.settings.__class__(**{**entry.settings.__dict__, "threads": alone})))
    write_config(config, updates)
    return config


def measure(mode: Mode, mix: Mix, rates: Mapping[str, float], seconds: float, config: Path, folder: Path,
            say) -> dict:
    base = oversubscribed_config(config, folder / "config") if mode.oversubscribed else config
    window_s = seconds / 4
    rule = StabilityRule(tolerance_pct=1000.0, last=4, max_windows=4, warmup=WARMUP_WINDOWS)
    say(f"[{mode.name}] {mode.shown}")
    with TorchServe(MODEL_STORE, base_config=base, command=mode.command, workdir=folder / "server",
                    env=mode.env, start_timeout_s=240) as ts:
        threads = {m: runner.worker_threads(ts, m) for m in ServerConfig.load(base).model_names}
        say(f"[{mode.name}] workers' threads {threads}")
        target = loadgen.Target.for_model(ts.inference_url, mix.names[0], ts.tokens.inference, timeout_s=120.0)
        payloads = mixed_payloads(mix, {m: loadgen.payloads_for(m) for m in mix.names})
        runner.warm_up(target, payloads, seconds=3.0, concurrency=4)
        total = sum(rates.values())
        result = loadgen.open_loop(target, payloads, total, rule, window_s, connections=32, seed=1,
                                   drain_s=30.0, progress=lambda line: say(f"[{mode.name}] {line.strip()}"))
        point = MixPoint.of(result, mix)
    say(f"[{mode.name}] {point.describe()}")
    return {"mode": mode.name, "command": mode.shown, "threads": threads, "point": point.to_json()}


def markdown(content: dict) -> str:
    rates = ", ".join(f"{m} {r:g}" for m, r in content["rates"].items())
    lines = ["# The tuned plan, however TorchServe is started", "",
             f"Command: `{content['command']}`. Open loop, Poisson, {rates} req/s at once, "
             f"{content['seconds']:g} s measured per start (after a {content['seconds'] / 4:g} s window not "
             f"counted); {content['machine']}.", "",
             "| started | threads per worker | " + " | ".join(f"{m} p50 / p99 (ms) | {m} n" for m in content["rates"])
             + " | errors + unanswered |", "|---|---|" + "---|---|" * len(content["rates"]) + "---|"]
    for row in content["modes"]:
        models = row["point"]["models"]
        cells = []
        for m in content["rates"]:
            lat = models[m]["latency_ms"]
            cells.append("-" if lat is None else f"{lat['p50_ms']:.0f} / {stats.tail_cell(lat, 0)}")
            cells.append(str(models[m]["requests"]))
        failed = sum(sum(f["errors"].values()) + f["unanswered"] for f in models.values())
        threads = ", ".join(f"{m} {'/'.join(map(str, t))}" for m, t in row["threads"].items())
        lines.append(f"| `{row['command']}` | {threads} | " + " | ".join(cells) + f" | {failed} |")
    lines += ["", "![p50 and p99 per start](latency.png)", ""]
    return "\n".join(lines)


def plot(content: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(content["rates"])
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.5))
    for ax, name in zip(axes, names):
        modes = [r["mode"] for r in content["modes"]]
        for offset, key, colour in ((-0.2, "p50_ms", "#1f77b4"), (0.2, "p99_ms", "#d62728")):
            values = [(r["point"]["models"][name]["latency_ms"] or {}).get(key, float("nan")) for r in content["modes"]]
            ax.bar([i + offset for i in range(len(modes))], values, width=0.4, color=colour, label=key[:3])
        ax.axhline(content["slo_ms"][name], color="k", linestyle="--", linewidth=1, label="SLO")
        ax.set_xticks(range(len(modes)), modes, rotation=20)
        ax.set_yscale("log")
        ax.set_ylabel("latency (ms, log)")
        ax.set_title(f"{name} at {content['rates'][name]:g} req/s")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", help="<model>=<req/s>,... offered at once (default: 40%% of each model's rate at "
                                   "the capacity of the config's mix record)")
    p.add_argument("--seconds", type=float, default=60.0, help="measured seconds per start (default 60)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--out", type=Path, default=REPORTS)
    args = p.parse_args(argv)
    rates = parse_rates(args.rates) if args.rates else default_rates(args.config, 0.4)
    catalogue = Catalogue.load(CATALOGUE)
    slo = {m: catalogue.entry(m).slo_ms for m in rates}
    mix = Mix({m: r / sum(rates.values()) for m, r in rates.items()}, slo)
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown[0]!r} (one of {', '.join(MODES)})")

    def say(line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)

    rows = []
    with tempfile.TemporaryDirectory(prefix="start-modes-") as tmp:
        for i, name in enumerate(args.modes.split(",")):
            say(f"start {i + 1} of {len(args.modes.split(','))}")
            rows.append(measure(MODES[name], mix, rates, args.seconds, args.config, Path(tmp) / name, say))
    content = {"command": "python -m benchmarks.tune.start_modes " + " ".join(argv or sys.argv[1:]),
               "config": shown(args.config), "rates": rates, "slo_ms": slo, "seconds": args.seconds,
               "machine": resources.machine_conditions(), "modes": rows}
    folder = args.out / f"start-modes-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(content, indent=1, default=str), encoding="utf-8")
    content["machine"] = f"{usable_cores()} cores, load average {content['machine'].get('load_average')}"
    (folder / "report.md").write_text(markdown(content), encoding="utf-8")
    plot(content, folder / "latency.png")
    print(markdown(content))
    print(f"report: {shown(folder / 'report.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
