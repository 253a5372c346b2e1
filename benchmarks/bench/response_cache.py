"""Benchmark the response cache: capacity at the SLO with the cache against without it, on a
Zipf-distributed workload (s = 1.1 over 1,000 distinct inputs) and on all-distinct inputs (what the
cache costs when it never hits). One server, the archive with `response_cache` on; "without" sends
the same requests with `Cache-Control: no-cache` (no key, no lookup, nothing stored).

Capacity is open loop, as everywhere a latency target is claimed: the highest Poisson rate within
p99 <= SLO, every request answered (benchmarks/load/capacity.py, the tuner's search). The two arms'
searches measure in turn, point for point, so a slow spell of the machine falls on both. Where the
load generator, not the server, is what stops the cache arm, the figure is a floor and says so. The
cost on all-distinct inputs is then measured again as throughput at one concurrency, over several
alternating pairs, since a capacity read off a p99 crossing moves with the noise of one point.

    python -m benchmarks response-cache --model minilm

Writes benchmarks/reports/response-cache-<model>-<time>/ (report.json, report.md, capacity.png).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import yaml

from benchmarks.bench.archive_settings import with_handler_settings
from benchmarks.bench.response_cache_report import markdown, plot
from benchmarks.load import cli
from benchmarks.load.capacity import RateSearch, RateSettings, find_max_rate
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.loadgen import Payload, Target, closed_loop, open_loop
from benchmarks.load.runner import OpenPoint, open_window_s
from benchmarks.load.stats import StabilityRule
from serving.launcher import TorchServe
from serving.repo import CATALOGUE, MODEL_STORE, shown
from serving.ts_config import ModelSettings

NO_CACHE = (("Cache-Control", "no-cache"),)


def log(message: str) -> None:
    print(f"[response-cache-bench] {message}", file=sys.stderr, flush=True)


def with_cache(src: Path, store: Path, name: str, max_mib: float) -> None:
    """`store/<name>.mar`: the archive with `response_cache.max_mib` set."""
    with_handler_settings(src, store, name, {"response_cache": {"max_mib": max_mib, "max_entries": 100_000}})


def sentences() -> list[str]:
    """Distinct sentences of Python's own documentation (real text, installed with Python)."""
    from pydoc_data.topics import topics

    seen, out = set(), []
    for name in sorted(topics):
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(topics[name].split())):
            if 20 <= len(sentence) <= 300 and sentence not in seen:
                seen.add(sentence)
                out.append(sentence)
    return out


def distinct_texts(pool: Sequence[str], count: int, seed: int) -> list[str]:
    """`count` distinct texts, each two sentences of `pool`, in a seeded random order. The order matters:
    Python's documentation runs in topics whose sentences differ in length by region, so texts in the
    order they are made would give each arm and each point a different cost per request."""
    texts = [f"{pool[i % len(pool)]} {pool[(i // len(pool)) % len(pool)]}" for i in range(count)]
    if len(set(texts)) != count:
        raise SystemExit(f"error: {len(pool)} sentences make fewer than {count} distinct pairs: lower --distinct")
    order = np.random.default_rng(seed).permutation(count)
    return [texts[i] for i in order]


def zipf_order(universe: int, count: int, s: float, seed: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, universe + 1) ** s
    return np.random.default_rng(seed).choice(universe, size=count, p=weights / weights.sum())


def text_field(entry: dict, model: str) -> tuple:
    """The model's first catalogue example as a template: a JSON request with one string field, which
    the workloads fill with their sentences. Returns (the example, the field's name)."""
    example = ((entry.get("examples") or [{}])[0] or {}).get("json")
    fields = [k for k, v in example.items() if isinstance(v, str)] if isinstance(example, dict) else []
    if len(fields) != 1:
        raise SystemExit(f"error: {model}'s first catalogue example is not a JSON request with one text field: "
                         "this benchmark varies that field (choose a model that takes text)")
    return example, fields[0]


def payloads(template: dict, field: str, texts: Sequence[str], headers=()) -> list[Payload]:
    return [Payload(json.dumps({**template, field: t}).encode(), "application/json", headers=headers) for t in texts]


# Open-loop points as the bench and the tuner measure them.
POINT_REQUESTS = 2000
MIN_WINDOW_REQUESTS = 20
CONNECTIONS = 64
GENERATOR_LIMIT = "could not keep up"  # a point's warning when the load generator, not the server, fell behind
# A search that finds no passing rate stops below its start / IDLE_DIVISOR (the start being 60% of the
# closed-loop throughput): there the server is idle most of the time, so a tail over the SLO is the
# service time, and each lower point would only take longer (2,000 arrivals) to say the same.
IDLE_DIVISOR = 8


@dataclass
class Arm:
    """One arm of one workload: its requests and, for all-distinct inputs, where the next point starts
    (no input is ever sent twice)."""

    payloads: list[Payload]
    distinct: bool
    offset: int = 0

    def stream(self) -> list[Payload]:
        return self.payloads[self.offset:] if self.distinct else self.payloads

    def used(self, count: int) -> None:
        if self.distinct:
            self.offset += count
            if self.offset >= len(self.payloads):
                raise SystemExit("error: the all-distinct workload ran out of inputs: raise --distinct")


class Turns:
    """Searches that measure in turn, one point each (A, B, A, B, ...), until each is done."""

    def __init__(self, names: Sequence[str]) -> None:
        self.order, self.turn, self.done = list(names), 0, set()
        self.cond = threading.Condition()

    def _mine(self, name: str) -> bool:
        live = [n for n in self.order if n not in self.done]
        return live[self.turn % len(live)] == name

    def wrap(self, name: str, probe):
        def in_turn(rate: float):
            with self.cond:
                self.cond.wait_for(lambda: self._mine(name))
            try:
                return probe(rate)
            finally:
                with self.cond:
                    self.turn += 1
                    self.cond.notify_all()
        return in_turn

    def finish(self, name: str) -> None:
        with self.cond:
            self.done.add(name)
            self.cond.notify_all()


def descent_floor(start_rps: float, settings: RateSettings) -> RateSettings:
    """The arm's search settings: no point below its start / IDLE_DIVISOR."""
    return replace(settings, min_rps=max(settings.min_rps, start_rps / IDLE_DIVISOR))


def search_arms(target: Target, arms: dict[str, Arm], slo_ms: float, start_rps: dict[str, float],
                rule: StabilityRule, window_s: float, settings: RateSettings) -> dict[str, dict]:
    """Each arm's capacity at the SLO, open loop, the arms measuring in turn."""
    turns, found, failed = Turns(list(arms)), {}, []

    def search(name: str) -> None:
        arm = arms[name]

        def probe(rate: float) -> OpenPoint:
            window = open_window_s(rate, window_s, POINT_REQUESTS, rule.last, MIN_WINDOW_REQUESTS)
            log(f"  {name}: open loop, Poisson {rate:.1f} req/s")
            result = open_loop(target, arm.stream(), rate, rule, window, CONNECTIONS, seed=int(rate * 1000),
                               drain_s=max(10.0, 2 * window), progress=log)
            arm.used(len(result.samples))
            return OpenPoint(result.figures())

        try:
            found[name] = find_max_rate(turns.wrap(name, probe), start_rps[name], slo_ms,
                                        descent_floor(start_rps[name], settings))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            failed.append(exc)
        finally:
            turns.finish(name)

    threads = [threading.Thread(target=search, args=(name,), name=f"search-{name}") for name in arms]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]
    return {name: arm_figures(search, slo_ms) for name, search in found.items()}


def arm_figures(search: RateSearch, slo_ms: float) -> dict:
    """The arm's points and capacity; a floor when the load generator fell behind above it."""
    points = [{"rate_rps": round(p.rate_rps, 1), "offered_rps": round(p.offered_rps, 1),
               "achieved_rps": round(p.achieved_rps, 1), "p99_ms": p.p99_ms and round(p.p99_ms, 2),
               "latency_ms": p.figures["latency_ms"], "requests": p.figures["requests"],
               "stable": p.figures["stable"], "passes": p.passes(slo_ms), "warnings": p.figures["warnings"]}
              for p in sorted(search.points, key=lambda p: p.rate_rps)]
    best = search.best
    above = [p for p in points if not p["passes"] and (best is None or p["rate_rps"] > best.rate_rps)]
    floor = bool(above) and all(any(GENERATOR_LIMIT in w for w in p["warnings"]) for p in above)
    return {"points": points, "capacity_rps": round(best.achieved_rps, 1) if best else 0.0,
            "p99_ms": round(best.p99_ms, 2) if best else None, "floor": floor or (best is not None and not above)}


def start_rate(target: Target, arm: Arm, rule: StabilityRule, window_s: float, level: int = 8) -> float:
    """Where an arm's search starts: 60% of its closed-loop throughput at `level` clients."""
    result = closed_loop(target, arm.stream(), level, rule, window_s, progress=log)
    arm.used(len(result.samples))
    return max(1.0, round(0.6 * result.figures()["throughput_rps"], 1))


def paired_peak(target: Target, workload: dict[str, list[Payload]], level: int, pairs: int, offset: int,
                rule: StabilityRule, window_s: float) -> list[dict]:
    """All-distinct inputs at one concurrency past the knee, the arms alternating `pairs` times (each
    pair in the other order than the last): the cache's cost on throughput, with its spread."""
    out = []
    for i in range(pairs):
        pair = {}
        for arm in (list(workload) if i % 2 == 0 else list(workload)[::-1]):
            result = closed_loop(target, workload[arm][offset:], level, rule, window_s, progress=log)
            offset += len(result.samples)
            if offset >= len(workload[arm]):
                raise SystemExit("error: the all-distinct workload ran out of inputs: raise --distinct")
            pair[arm] = round(result.figures()["throughput_rps"], 1)
        pair["ratio"] = round(pair["cache"] / pair["no_cache"], 4)
        log(f"  pair {i + 1}/{pairs} at concurrency {level}: cache {pair['cache']} / no cache {pair['no_cache']} "
            f"req/s = {pair['ratio']:.3f}")
        out.append(pair)
    return out


def cache_cost(model: str, bodies: Sequence[bytes], answer: bytes, max_mib: float) -> dict:
    """What the cache adds to a request that never hits, in this process: its key (the canonical
    body's blake2b), a lookup and storing the answer, with evictions once full; microseconds each."""
    from handlers.response_cache import (
        ResponseCache,
        ResponseCacheSettings,
        request_key,
    )

    runs = []
    for _ in range(5):
        cache = ResponseCache(ResponseCacheSettings(max_mib=max_mib, max_entries=100_000))
        started = time.perf_counter()
        for body in bodies:
            key = request_key(model, "1.0", "", body, "application/json")
            if cache.get(key) is None:
                cache.put(key, answer)
        runs.append((time.perf_counter() - started) / len(bodies) * 1e6)
    return {"us_per_request": round(float(np.median(runs)), 2), "runs_us": [round(r, 2) for r in runs],
            "requests": len(bodies), "answer_bytes": len(answer)}


def main(argv: Sequence[str]) -> int:
    p = cli.parser("response-cache", __doc__.split("\n")[0])
    cli.add(p, "slo_ms", "out", model={"required": True, "help": "a catalogue model whose first example is JSON with one "
                                                                 "text field"},
            window_s={"default": 5.0, "help": "open-loop window (the bench's)"},
            max_points={"default": 7}, workers={"default": 2}, batch_size={"default": 4})
    p.add_argument("--universe", type=int, default=1000, help="distinct inputs of the Zipf workload")
    p.add_argument("--zipf-s", type=float, default=1.1)
    p.add_argument("--distinct", type=int, default=400_000, help="inputs available to the all-distinct workload")
    p.add_argument("--pairs", type=int, default=8, help="alternating all-distinct pairs at --pair-level")
    p.add_argument("--pair-level", type=int, default=8, help="closed-loop concurrency of those pairs")
    p.add_argument("--max-mib", type=float, default=64)
    args = p.parse_args(argv)
    entry = yaml.safe_load(CATALOGUE.read_text())["models"][args.model]
    slo_ms = args.slo_ms if args.slo_ms is not None else float(entry.get("slo_ms", 100))
    if slo_ms <= 0:
        raise BenchmarkError(f"--slo-ms {slo_ms:g}: give a p99 target in milliseconds above 0")
    template, field = text_field(entry, args.model)
    pool = sentences()
    if len(pool) < args.universe:
        raise BenchmarkError(f"only {len(pool)} distinct sentences for --universe {args.universe}: give a smaller one")
    universe = pool[:args.universe]
    zipf = [universe[i] for i in zipf_order(args.universe, 200_000, args.zipf_s, seed=0)]
    # All distinct: pairs of sentences, none of them the Zipf universe's, never sent twice.
    distinct = distinct_texts(pool[args.universe:], args.distinct, seed=0)
    # Three disjoint thirds of the all-distinct inputs: the cache arm's search, the no-cache arm's, the pairs.
    third = len(distinct) // 3
    workloads = {
        "zipf": {"cache": Arm(payloads(template, field, zipf), False),
                 "no_cache": Arm(payloads(template, field, zipf, NO_CACHE), False)},
        "distinct": {"cache": Arm(payloads(template, field, distinct[:third]), True),
                     "no_cache": Arm(payloads(template, field, distinct[third:2 * third], NO_CACHE), True)},
    }
    pairs = {"cache": payloads(template, field, distinct[2 * third:]),
             "no_cache": payloads(template, field, distinct[2 * third:], NO_CACHE)}
    rule, settings = StabilityRule(), RateSettings(max_points=args.max_points)
    when = cli.stamp()
    report = {"model": args.model, "when": when, "slo_ms": slo_ms, "universe": args.universe,
              "zipf_s": args.zipf_s, "workers": args.workers, "batch_size": args.batch_size, "max_mib": args.max_mib,
              "point_requests": POINT_REQUESTS, "window_s": args.window_s,
              "command": cli.command_line("response-cache", argv)}
    with tempfile.TemporaryDirectory(prefix="cachebench-") as tmp:
        with_cache(MODEL_STORE / f"{args.model}.mar", Path(tmp), args.model, args.max_mib)
        settings_ = {args.model: ModelSettings(batch_size=args.batch_size, max_batch_delay_ms=1,
                                               min_workers=args.workers, max_workers=args.workers)}
        with TorchServe(Path(tmp), models=settings_, load=(args.model,)) as server:
            target = Target.for_model(server.client.endpoints.inference, args.model, server.client.tokens.inference)
            answer = server.predict(args.model, pairs["cache"][-1].body, "application/json").content
            for name, arms in workloads.items():
                log(f"{name}: where each arm's search starts (closed loop, 8 clients)")
                starts = {arm: start_rate(target, a, rule, args.window_s) for arm, a in arms.items()}
                log(f"{name}: capacity at p99 <= {slo_ms:g} ms, open loop, the arms measuring in turn")
                report[name] = search_arms(target, arms, slo_ms, starts, rule, args.window_s, settings)
            log(f"all-distinct inputs: {args.pairs} alternating pairs at concurrency {args.pair_level}")
            report["distinct_pairs"] = paired_peak(target, pairs, args.pair_level, args.pairs, 0, rule,
                                                   args.window_s)
            report["metrics"] = {name: server_total(server, name, args.model)
                                 for name in ("ResponseCacheHits", "ResponseCacheMisses", "ResponseCacheEvictions",
                                              "ResponseCacheBytes")}
    report["cost"] = cache_cost(args.model, [p.body for p in workloads["distinct"]["cache"].payloads[:10_000]], answer,
                                args.max_mib)
    # One request's worker time, from the no-cache arm's capacity on all-distinct inputs.
    best = report["distinct"]["no_cache"]["capacity_rps"] or 1.0
    report["cost"]["share_of_service"] = report["cost"]["us_per_request"] / (args.workers / best * 1e6)
    for workload in ("zipf", "distinct"):
        arms = report[workload]
        report[f"{workload}_ratio"] = (round(arms["cache"]["capacity_rps"] / arms["no_cache"]["capacity_rps"], 2)
                                       if arms["no_cache"]["capacity_rps"] else None)
    ratios = [p["ratio"] for p in report["distinct_pairs"]]
    report["distinct_pair_ratio"] = {"median": round(float(np.median(ratios)), 4), "min": min(ratios),
                                     "max": max(ratios), "level": args.pair_level}
    folder = cli.report_folder(args.out, "response-cache", args.model, when=when)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "report.md").write_text(markdown(report))
    plot(report, folder)
    log(f"report: {shown(folder / 'report.md')}")
    print(markdown(report))
    return 0


def server_total(server, name: str, model: str) -> float:
    from benchmarks.load.server_metrics import Scrape

    return Scrape.of(server.metrics_text()).total(name, model)

