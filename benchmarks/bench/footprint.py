"""The whole server's footprint, TorchServe against Ray Serve: ready time, idle memory by process
role, and stop time, each engine serving what `make serve` serves (config.properties' load_models
with its values).

    python -m benchmarks footprint --rounds 2 [--engine torchserve,ray]

Each round starts each engine in turn from nothing (the order alternates between rounds), times it
to ready (every model answering), lets it idle, reads the memory of every process of its session
(psutil: RSS, PSS and USS, summed per role), then stops it and times that. "Per model" is the
session's PSS over the models served; "model processes" are TorchServe's workers and Ray's model
replicas. Writes benchmarks/reports/footprint-<time>/ (report.json, report.md, footprint.png).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from benchmarks.bench.engines import session_procs
from benchmarks.load import cli
from serving.launcher import TorchServe
from serving.ray import serve_config
from serving.ray.launcher import RayServe
from serving.repo import DEFAULT_CONFIG
from serving.ts_config import ServerConfig

log = cli.progress("footprint")
IDLE_S = 10.0  # after ready, before memory is read
MIB = 2**20
# A process's role, from its title (the first match wins): what each engine's memory is made of.
ROLES = (
    ("model processes", ("model_service_worker", "ServeReplica:")),
    ("frontend (JVM)", ("org.pytorch.serve.ModelServer",)),
    ("Serve controller and proxies", ("ServeController", "ProxyActor", "HAProxyManager")),
    ("HAProxy", ("haproxy",)),
    ("node (ray start)", ("bin/ray start",)),
)
OTHER = "Ray's daemons (GCS, raylet, agents)"
INGRESS = "ingress replica"
ORDER = (ROLES[0][0], INGRESS, *(name for name, _ in ROLES[1:]), OTHER)  # the report's columns and the plot's stack


def role(proc: psutil.Process) -> str:
    title = proc.name() + " " + " ".join(proc.cmdline())
    if "ServeReplica:ingress:" in title:
        return INGRESS
    return next((name for name, marks in ROLES if any(m in title for m in marks)), OTHER)


def memory(procs: Sequence[psutil.Process]) -> dict[str, dict[str, float]]:
    """MiB of RSS, PSS and USS per role, and the count of processes."""
    out: dict[str, dict[str, float]] = {}
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            info, name = proc.memory_full_info(), role(proc)
            row = out.setdefault(name, {"processes": 0, "rss_mib": 0.0, "pss_mib": 0.0, "uss_mib": 0.0})
            row["processes"] += 1
            for key in ("rss", "pss", "uss"):
                row[f"{key}_mib"] += getattr(info, key) / MIB
    return {name: {k: round(v, 1) for k, v in row.items()} for name, row in sorted(out.items())}


def server(engine: str, store: Path, config_path: Path) -> tuple[TorchServe | RayServe, int]:
    """What make serve (ENGINE=ray) starts, and how many models it serves."""
    config = ServerConfig.load(config_path)
    archives = config.startup_archives(store)
    if engine == "torchserve":
        return TorchServe(store, base_config=config_path), len(archives)
    limits = serve_config.configured_limits(config_path)
    settings = {e.name: e.settings for e in config.models if e.name in archives}
    return RayServe(store, models=tuple(archives), settings=settings, max_request_size=limits.max_request_size,
                    job_queue_size=limits.job_queue_size), len(archives)


def one(engine: str, store: Path, config_path: Path) -> dict[str, Any]:
    running, models = server(engine, store, config_path)
    began = time.monotonic()
    with running:
        ready_s = time.monotonic() - began
        log(f"{engine}: {models} models ready in {ready_s:.1f} s; idle {IDLE_S:.0f} s")
        time.sleep(IDLE_S)
        roles = memory(session_procs(running))
        stopping = time.monotonic()
    stop_s = time.monotonic() - stopping
    total = {k: round(sum(r[k] for r in roles.values()), 1) for k in ("processes", "rss_mib", "pss_mib", "uss_mib")}
    log(f"{engine}: PSS {total['pss_mib']:.0f} MiB over {total['processes']:.0f} processes; stopped in {stop_s:.1f} s")
    return {"engine": engine, "models": models, "ready_s": round(ready_s, 1), "stop_s": round(stop_s, 1),
            "roles": roles, "total": total, "pss_per_model_mib": round(total["pss_mib"] / models, 1)}


def summary(runs: Sequence[dict[str, Any]], engine_names: Sequence[str]) -> list[dict[str, Any]]:
    """Per engine, the median over rounds (ready, stop, PSS in all, per model, of the model processes)."""
    out = []
    for engine in engine_names:
        mine = [r for r in runs if r["engine"] == engine]
        med = lambda f, mine=mine: round(statistics.median(f(r) for r in mine), 1)  # noqa: E731
        out.append({"engine": engine, "rounds": len(mine), "models": mine[0]["models"],
                    "ready_s": med(lambda r: r["ready_s"]), "stop_s": med(lambda r: r["stop_s"]),
                    "pss_mib": med(lambda r: r["total"]["pss_mib"]),
                    "pss_per_model_mib": med(lambda r: r["pss_per_model_mib"]),
                    "model_pss_mib": med(lambda r: r["roles"].get("model processes", {}).get("pss_mib", 0.0))})
    return out


def markdown(runs: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], command: str) -> str:
    base = rows[0]
    lines = [f"# The whole server's footprint, {' against '.join(cli.ENGINE_NAMES[r['engine']] for r in rows)}", "",
             f"`{command}` ({psutil.cpu_count()} cores; medians over rounds, engines alternating; ratios "
             f"against {cli.ENGINE_NAMES[base['engine']]})", ""]
    lines += cli.table(("engine", "models", "rounds", "ready s", "idle PSS MiB", "per model MiB",
                        "model processes MiB", "stop s"),
                       [(cli.ENGINE_NAMES[r["engine"]], r["models"], r["rounds"],
                         f"{r['ready_s']} ({r['ready_s'] / base['ready_s']:.2f}x)", f"{r['pss_mib']:.0f}",
                         f"{r['pss_per_model_mib']:.0f} ({r['pss_per_model_mib'] / base['pss_per_model_mib']:.2f}x)",
                         f"{r['model_pss_mib']:.0f} ({r['model_pss_mib'] / base['model_pss_mib']:.2f}x)",
                         r["stop_s"]) for r in rows])
    lines += ["", "Each round, memory by role (PSS MiB, processes):", ""]
    names = _present(runs)
    lines += cli.table(("round, engine", *names),
                       [(f"{i // len(rows) + 1}, {cli.ENGINE_NAMES[r['engine']]}",
                         *(f"{r['roles'][n]['pss_mib']:.0f} ({r['roles'][n]['processes']:.0f})" if n in r["roles"]
                           else "-" for n in names)) for i, r in enumerate(runs)])
    return "\n".join([*lines, "", "![memory by role](footprint.png)", ""])


def _present(runs: Sequence[dict[str, Any]]) -> list[str]:
    return [name for name in ORDER if any(name in r["roles"] for r in runs)]


def plot(path: Path, runs: Sequence[dict[str, Any]]) -> None:
    """Stacked PSS by role, one bar per round and engine."""
    names = _present(runs)
    labels = [f"{cli.ENGINE_NAMES[r['engine']]}\nround {i}" for i, r in enumerate(runs, 1)]
    with cli.figure(path, figsize=(max(6, 1.6 * len(runs)), 5)) as ax:
        bottom = [0.0] * len(runs)
        for name in names:
            heights = [r["roles"].get(name, {}).get("pss_mib", 0.0) for r in runs]
            ax.bar(labels, heights, bottom=bottom, label=name)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_ylabel("idle PSS (MiB)")
        ax.set_title("The whole server's idle memory by role")
        ax.tick_params(axis="x", labelsize=7)
        ax.legend(fontsize=7)


def main(argv: Sequence[str]) -> int:
    p = cli.parser("footprint", __doc__.splitlines()[0])
    cli.add(p, "model_store", "out", "config")
    p.add_argument("--engine", type=cli.engines, default=("torchserve", "ray"), help="engines, comma-separated")
    p.add_argument("--rounds", type=int, default=2, help="starts per engine")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: give 1 or more")
    config_path = Path(args.config or DEFAULT_CONFIG)
    runs = []
    for round_ in range(args.rounds):
        order = args.engine if round_ % 2 == 0 else tuple(reversed(args.engine))
        for engine in order:
            log(f"round {round_ + 1} of {args.rounds}: {engine}")
            runs.append(one(engine, Path(args.model_store), config_path))
    rows = summary(runs, args.engine)
    folder = cli.report_folder(args.out, "footprint")
    folder.mkdir(parents=True)
    command = cli.command_line("footprint", argv)
    (folder / "report.json").write_text(json.dumps({"command": command, "summary": rows, "runs": runs}, indent=2),
                                        encoding="utf-8")
    text = markdown(runs, rows, command)
    (folder / "report.md").write_text(text, encoding="utf-8")
    plot(folder / "footprint.png", runs)
    print("\n".join(text.splitlines()[4:6 + len(rows)]))
    print(f"report: {folder / 'report.md'}")
    return 0
