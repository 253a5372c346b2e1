"""TorchServe against Ray Serve (its default Python proxy and its HAProxy ingress), same host, same
run, same archives, each engine with its own tuned values: ready time, idle memory, p50 at one
client, capacity within the SLO and the CPU each request costs, per model.

    python -m benchmarks engines --model minilm,efficientnet_lite0 --generation tinylm

Per model the arms run back to back (TorchServe, Ray's proxy, Ray's HAProxy), each on a fresh
server serving that model alone: ready time, the PSS and RSS of every process of the engine's
session after it idles, p50 over a closed loop of one client, the CPU seconds each role of the
session (the processes holding the model, the engine's other processes) and the load generator spent
per answered request over a closed loop of `2 x workers x batch size` clients, then the highest
open-loop rate whose p99 is within the catalogue's SLO (benchmarks.load.capacity's search). TorchServe takes
config.properties' values; Ray the model's app in --serve-config (make tune ENGINE=ray's file), else
the same values as TorchServe. `--generation <lm>`: the ray-generation verb's rows in the same run
(TorchServe's async mode, Ray behind either ingress).

Writes benchmarks/reports/engines-<time>/ (report.json, report.md, capacity.png).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import psutil

from benchmarks.bench import ray_generation
from benchmarks.bench.archive_settings import with_handler_settings
from benchmarks.bench.generation_load import PLAIN
from benchmarks.load import cli, loadgen, runner
from benchmarks.load.budget import Budget, BudgetSpent
from benchmarks.load.capacity import Point, RateSettings, find_max_rate
from benchmarks.load.loadgen import Target
from benchmarks.load.stats import StabilityRule
from build.catalogue import Catalogue
from serving.launcher import TorchServe
from serving.ray import serve_config
from serving.ray.launcher import RayServe
from serving.repo import CATALOGUE, REPO_ROOT, shown
from serving.ts_config import ServerConfig

log = cli.progress("engines")
ARMS = ("TorchServe", "Ray (proxy)", "Ray (HAProxy)")
IDLE_S = 5.0  # after ready, before memory is read
GIB = 2**30


def parse(argv: list[str]):
    p = cli.parser("engines", __doc__.splitlines()[0])
    cli.add(p, "model_store", "out", "config", model={"default": "minilm,efficientnet_lite0",
                                                      "help": "catalogue models, comma-separated"},
            point_requests={"default": 1000}, max_points={"default": 5})
    p.add_argument("--serve-config", type=Path, default=REPO_ROOT / "ray-serve.yaml",
                   help="Ray's tuned values (make tune ENGINE=ray's file); a model not in it: config.properties'")
    p.add_argument("--arm-budget-min", type=float, default=4.0,
                   help="capacity search per arm: a point that would not end within this is not started")
    p.add_argument("--generation", default="", help="also an LM's ray-generation rows (e.g. tinylm)")
    p.add_argument("--clients", type=int, default=8, help="--generation: streaming clients")
    p.add_argument("--rounds", type=int, default=3, help="--generation: requests per client")
    return p.parse_args(argv)


def memory(procs: list[psutil.Process]) -> dict:
    """RSS and PSS (GiB) summed over the session's processes, and their count; `model_pss_gib`: the
    processes that hold the model (TorchServe's workers, Ray's replicas), what each further model adds."""
    rss = pss = held = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            info = proc.memory_full_info()
            mine = getattr(info, "pss", info.rss)
            rss, pss = rss + info.rss, pss + mine
            held += mine if holds_model(proc) else 0
    return {"processes": len(procs), "rss_gib": round(rss / GIB, 3), "pss_gib": round(pss / GIB, 3),
            "model_pss_gib": round(held / GIB, 3)}


def holds_model(proc: psutil.Process) -> bool:
    """A TorchServe model worker (model_service_worker) or a Ray Serve replica (ServeReplica)."""
    with contextlib.suppress(psutil.Error):
        title = proc.name() + " " + " ".join(proc.cmdline())
        return "model_service_worker" in title or "ServeReplica" in title
    return False


def cpu_seconds(procs: list[psutil.Process]) -> dict[int, tuple[bool, float]]:
    """Each live process's CPU time so far (user + system), and whether it holds the model."""
    out = {}
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            out[proc.pid] = (holds_model(proc), times.user + times.system)
    return out


def cpu_per_request(before: dict[int, tuple[bool, float]], after: dict[int, tuple[bool, float]],
                    load_s: float, requests: int) -> dict:
    """Milliseconds of CPU per answered request between two `cpu_seconds` readings, by role: the
    processes holding the model, the engine's other processes, the load generator (this process)."""
    model = rest = 0.0
    for pid, (holds, seconds) in after.items():
        spent = seconds - before.get(pid, (holds, 0.0))[1]
        model, rest = (model + spent, rest) if holds else (model, rest + spent)
    per = 1000.0 / max(1, requests)
    return {"model_ms": round(model * per, 3), "engine_ms": round(rest * per, 3),
            "load_ms": round(load_s * per, 3), "total_ms": round((model + rest + load_s) * per, 3),
            "requests": requests}


def own_cpu_s() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def session_procs(server) -> list[psutil.Process]:
    if isinstance(server, RayServe):
        return server.processes()
    java = psutil.Process(server.java_pid)
    return [java, *java.children(recursive=True)]


def measure(server, model: str, settings, slo_ms: float, args) -> dict:
    time.sleep(IDLE_S)
    idle = memory(session_procs(server))
    target = Target.for_model(server.inference_url, model, server.tokens.inference)
    payloads = loadgen.payloads_for(model)
    quiet = lambda line: None  # noqa: E731
    in_flight = max(2, 2 * settings.min_workers * settings.batch_size)
    runner.warm_up(target, payloads, 5.0, in_flight)
    one = loadgen.closed_loop(target, payloads, 1, StabilityRule(last=3, max_windows=4), 3.0, progress=quiet).figures()
    procs, own = session_procs(server), own_cpu_s()
    before = cpu_seconds(procs)
    result = loadgen.closed_loop(target, payloads, in_flight, StabilityRule(last=2, max_windows=3), 2.0,
                                 progress=quiet)
    cpu = cpu_per_request(before, cpu_seconds(procs), own_cpu_s() - own, len(result.samples))
    busy = result.figures()
    rule = StabilityRule(last=3, max_windows=5)
    budget, points = Budget(60 * args.arm_budget_min), []

    def probe(rate: float) -> Point:
        window = runner.open_window_s(rate, 2.0, args.point_requests, rule.last)
        budget.require(f"{rate:.1f} req/s", (rule.warmup + rule.last) * window + 1.0)
        point = Point.of(loadgen.open_loop(target, payloads, rate, rule, window, 64, seed=int(rate * 1000),
                                           drain_s=max(5.0, 2 * window), progress=quiet).figures())
        log(f"    {rate:.1f} req/s: {point.achieved_rps:.1f} served, p99 {point.p99_ms:.1f} ms (n={point.samples})")
        points.append(point)
        return point

    with contextlib.suppress(BudgetSpent):  # the points measured until then are the arm's
        find_max_rate(probe, 0.8 * busy["throughput_rps"], slo_ms, RateSettings(max_points=args.max_points))
    best = max((p for p in points if p.passes(slo_ms)), key=lambda p: p.achieved_rps, default=None)
    return {"idle": idle, "p50_1_ms": one["latency_ms"]["p50_ms"], "closed_rps": round(busy["throughput_rps"], 1), "cpu": cpu,
            "capacity_rps": round(best.achieved_rps, 1) if best else 0.0,
            "capacity_p99_ms": best.p99_ms if best else None, "capacity_samples": best.samples if best else None,
            "points": [p.to_json() for p in points], "left_out": budget.left_out}


def arm(name: str, model: str, args, ts_config: ServerConfig, ray_tuned: dict, slo_ms: float) -> dict:
    ts = ts_config.model(model).settings
    settings = ts if name == "TorchServe" else ray_tuned.get(model, ts)
    log(f"{model}: {name}, {settings.to_json()}")
    began = time.monotonic()
    server = (TorchServe(args.model_store, base_config=args.config, models={model: settings}, load=(model,))
              if name == "TorchServe" else
              RayServe(args.model_store, models=(model,), settings={model: settings}, haproxy="HAProxy" in name))
    with server:
        ready_s = round(time.monotonic() - began, 1)
        row = measure(server, model, settings, slo_ms, args)
    source = "config.properties" if settings is ts else shown(args.serve_config)
    return {"model": model, "engine": name, "slo_ms": slo_ms, "settings": settings.to_json(), "from": source,
            "ready_s": ready_s, **row}


def compare(rows: list[dict]) -> list[dict]:
    """Each Ray row against the same model's TorchServe row: the targets (capacity >= 0.9x, p50
    within TorchServe's + 2 ms, the idle PSS of the processes holding the model <= 1.5x, ready <= 30 s)."""
    base = {r["model"]: r for r in rows if r["engine"] == "TorchServe"}
    out = []
    for r in rows:
        ts = base.get(r["model"])
        if ts is None or r is ts:
            continue
        cap = r["capacity_rps"] / ts["capacity_rps"] if ts["capacity_rps"] else None
        p50 = r["p50_1_ms"] - ts["p50_1_ms"]
        mem = r["idle"]["pss_gib"] / ts["idle"]["pss_gib"]
        held = r["idle"]["model_pss_gib"] / ts["idle"]["model_pss_gib"] if ts["idle"]["model_pss_gib"] else None
        cpu = r["cpu"]["total_ms"] / ts["cpu"]["total_ms"] if ts["cpu"]["total_ms"] else None
        closed = r["closed_rps"] / ts["closed_rps"] if ts["closed_rps"] else None
        out.append({"model": r["model"], "engine": r["engine"], "capacity_x": None if cap is None else round(cap, 2),
                    "p50_delta_ms": round(p50, 2), "pss_x": round(mem, 2),
                    "model_pss_x": None if held is None else round(held, 2),
                    "cpu_x": None if cpu is None else round(cpu, 2),
                    "closed_x": None if closed is None else round(closed, 2),
                    "met": {"capacity": cap is not None and cap >= 0.9, "p50": p50 <= 2.0,
                            "memory": held is not None and held <= 1.5,
                            "ready": r["ready_s"] <= 30.0}})
    return out


def brief(values: dict) -> str:
    """A model's values as one short cell: workers, batch size, batch delay, threads."""
    threads = values.get("threads")
    return (f"{values['minWorkers']}w, batch {values['batchSize']}, {values['maxBatchDelay']} ms"
            + (f", {threads} thr" if threads else ""))


def capacity_cell(row: dict) -> str:
    if row["capacity_p99_ms"] is None:
        return f"no point within the SLO ({len(row['points'])} tried)"
    return f"{row['capacity_rps']} ({row['capacity_p99_ms']:.1f}, {row['capacity_samples']})"


def cpu_cell(cpu: Optional[dict]) -> str:
    if not cpu:
        return "-"
    return f"{cpu['total_ms']} = {cpu['model_ms']} / {cpu['engine_ms']} / {cpu['load_ms']}"


def ratio(x: Optional[float]) -> str:
    """A capacity ratio; 0: Ray held the SLO at none of the rates its budget measured."""
    return "no TorchServe point" if x is None else "none within the SLO" if x == 0 else f"{x}x"


def markdown(report: dict) -> str:
    rows = report["rows"]
    lines = [f"# TorchServe against Ray Serve, {report['when']}", "",
             f"`{report['command']}` ({report['cpus']} cores; one run, arms back to back per model: ratios)", ""]
    lines += cli.table(
        ("model", "engine", "values (from)", "ready s", "idle PSS all / model, RSS GiB (procs)", "p50 1 client ms",
         "CPU ms per request: model / engine / load", "closed loop req/s", "capacity req/s (p99 ms, n)"),
        [(f"{r['model']} (SLO {r['slo_ms']:g} ms)" if "slo_ms" in r else r["model"], r["engine"],
          f"{brief(r['settings'])} ({r['from']})", r["ready_s"],
          f"{r['idle']['pss_gib']} / {r['idle'].get('model_pss_gib')}, {r['idle']['rss_gib']} ({r['idle']['processes']})", r["p50_1_ms"] and
          round(r["p50_1_ms"], 2), cpu_cell(r.get("cpu")), r["closed_rps"], capacity_cell(r))
         for r in rows])
    yes = {True: "met", False: "missed"}
    lines += ["", "Against TorchServe (targets: capacity >= 0.9x, p50 <= +2 ms, the model's idle PSS <= 1.5x, ready <= 30 s;"
              " CPU per request and the closed loop's throughput shown, not judged):", ""]
    lines += cli.table(("model", "engine", "capacity", "p50", "idle PSS: all, model", "ready", "CPU per request",
                        "closed loop"),
                       [(c["model"], c["engine"], f"{ratio(c['capacity_x'])} ({yes[c['met']['capacity']]})",
                         f"{c['p50_delta_ms']:+} ms ({yes[c['met']['p50']]})",
                         f"{c['pss_x']}x, {c.get('model_pss_x')}x ({yes[c['met']['memory']]})", yes[c["met"]["ready"]],
                         "-" if c.get("cpu_x") is None else f"{c['cpu_x']}x",
                         "-" if c.get("closed_x") is None else f"{c['closed_x']}x")
                        for c in report["compare"]])
    if report.get("generation"):
        lines += ["", f"{report['generation']['model']}, {report['clients']} streaming clients (output tokens/s):", ""]
        gen_rows = report["generation"]["rows"]
        best = max((g["tokens_per_s"] for g in gen_rows if g["engine"].startswith("TorchServe")), default=0.0)
        lines += cli.table(("engine", "tokens/s", "against TorchServe's best", "TTFT p50 ms", "TTFT p90 ms"),
                           [(g["engine"], g["tokens_per_s"], f"{g['tokens_per_s'] / best:.2f}x" if best else "-",
                             g["ttft_p50_ms"], g["ttft_p90_ms"]) for g in gen_rows])
    return "\n".join(lines + ["", "![capacity](capacity.png)", ""])


def plot(rows: list[dict], path: Path) -> None:
    models = list(dict.fromkeys(r["model"] for r in rows))
    with cli.figure(path, 1, 2, figsize=(10, 3.6)) as (cap, p50):
        for i, engine in enumerate(ARMS):
            mine = {r["model"]: r for r in rows if r["engine"] == engine}
            xs = [m + (i - 1) * 0.27 for m in range(len(models))]
            cap.bar(xs, [mine.get(m, {}).get("capacity_rps", 0) for m in models], 0.27, label=engine)
            p50.bar(xs, [mine.get(m, {}).get("p50_1_ms") or 0 for m in models], 0.27, label=engine)
        for ax, title in ((cap, "capacity within the SLO, req/s"), (p50, "p50 at one client, ms")):
            ax.set_xticks(range(len(models)), models)
            ax.set_title(title)
        cap.legend(fontsize=8)


def generation(args) -> dict:
    """The ray-generation verb's arms: TorchServe async 1x2 and 2x1, Ray 2 replicas behind each ingress."""
    gen = SimpleNamespace(model=args.generation, clients=args.clients, new_tokens=32, rounds=args.rounds,
                          ray_threads=0)
    with tempfile.TemporaryDirectory(prefix="engines-") as tmp:
        store = Path(tmp)
        with_handler_settings(args.model_store / f"{gen.model}.mar", store, gen.model,
                              {"causal_lm": {**PLAIN, "mode": "async"}})
        rows = [ray_generation.torchserve(store, gen, layout) for layout in ((1, 2), (2, 1))]
        rows += [ray_generation.ray(store, SimpleNamespace(**vars(gen), haproxy=haproxy), 2) for haproxy in (False, True)]
    return {"model": gen.model, "rows": rows}


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[2:] if argv is None else argv)
    args = parse(argv)
    when = cli.stamp()
    out = cli.report_folder(args.out, "engines", when=when)
    catalogue = Catalogue.load(CATALOGUE)
    ts_config = ServerConfig.load(args.config)
    ray_tuned = ({a.model: a.settings for a in serve_config.read(args.serve_config, args.model_store.resolve())}
                 if args.serve_config.is_file() else {})
    rows = [arm(name, model, args, ts_config, ray_tuned, catalogue.entry(model).slo_ms)
            for model in args.model.split(",") for name in ARMS]
    report = {"when": when, "cpus": os.cpu_count(), "command": cli.command_line("engines", argv),
              "clients": args.clients, "rows": rows, "compare": compare(rows),
              "generation": generation(args) if args.generation else None}
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(markdown(report), encoding="utf-8")
    plot(rows, out / "capacity.png")
    print(markdown(report))
    log(f"report: {shown(out / 'report.md')}")
    return 0
