"""Benchmark the response cache: capacity at the SLO with the cache against without it, on a
Zipf-distributed workload (s = 1.1 over 1,000 distinct inputs) and on all-distinct inputs (what the
cache costs when it never hits). One server, the archive with `response_cache` on; "without" sends
the same requests with `Cache-Control: no-cache` (no key, no lookup, nothing stored), and the two arms
alternate at every concurrency level, so a slow spell of the machine falls on both. The cost on
all-distinct inputs is then measured again as throughput at one concurrency, over several
alternating pairs, since a capacity read off a p99 crossing moves with the noise of one point.

    python -m benchmarks.bench.response_cache --model minilm

Writes benchmarks/reports/response-cache-<model>-<time>/ (report.json, report.md, capacity.png).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np
import yaml

from benchmarks.bench.archive_settings import with_handler_settings
from benchmarks.load import stats
from benchmarks.load.loadgen import LoadResult, Payload, Target, closed_loop
from benchmarks.load.stats import StabilityRule
from serving.launcher import TorchServe
from serving.repo import CATALOGUE, MODEL_STORE, REPORTS, shown
from serving.ts_config import ModelSettings

NO_CACHE = (("Cache-Control", "no-cache"),)


def log(message: str) -> None:
    print(f"[response-cache-bench] {message}", file=sys.stderr, flush=True)


def with_cache(src: Path, store: Path, name: str, max_mib: float) -> None:
    """`store/<name>.mar`: the archive with `response_cache.max_mib` set."""
    with_handler_settings(src, store, name, {"response_cache": {"max_mib": max_mib, "max_entries": 100_000}})


def sentences() -> List[str]:
    """Distinct sentences of Python's own documentation (real text, installed with Python)."""
    from pydoc_data.topics import topics

    seen, out = set(), []
    for name in sorted(topics):
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(topics[name].split())):
            if 20 <= len(sentence) <= 300 and sentence not in seen:
                seen.add(sentence)
                out.append(sentence)
    return out


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


def payloads(template: dict, field: str, texts: Sequence[str], headers=()) -> List[Payload]:
    return [Payload(json.dumps({**template, field: t}).encode(), "application/json", headers=headers) for t in texts]


def sweep(target: Target, workload: Dict[str, List[Payload]], levels: Sequence[int], rule: StabilityRule,
          window_s: float, distinct: bool) -> Tuple[Dict[str, List[dict]], int]:
    """Both arms at each level, alternating which goes first. All-distinct workloads never reuse an
    input: each point starts where the last one stopped. Returns the points and the inputs used."""
    out: Dict[str, List[dict]] = {arm: [] for arm in workload}
    offset = 0
    for i, level in enumerate(levels):
        arms = list(workload) if i % 2 == 0 else list(workload)[::-1]
        for arm in arms:
            stream = workload[arm][offset:] if distinct else workload[arm]
            result: LoadResult = closed_loop(target, stream, level, rule, window_s, progress=log)
            if distinct:
                offset += len(result.samples)
                if offset >= len(workload[arm]):
                    raise SystemExit("error: the all-distinct workload ran out of inputs: raise --distinct")
            figures = result.figures()
            latency = figures["latency_ms"]
            out[arm].append({"concurrency": level, "throughput_rps": round(figures["throughput_rps"], 1),
                             "p99_ms": round(latency["p99_ms"], 2), "p90_ms": round(latency["p90_ms"], 2),
                             "samples": latency["count"], "requests": figures["requests"],
                             "errors": figures["errors"], "stable": figures["stable"]})
            log(f"  {arm}, concurrency {level}: {figures['throughput_rps']:.1f} req/s, "
                f"{stats.tail_text(latency)} ({figures['requests']} requests)")
    return out, offset


def paired_peak(target: Target, workload: Dict[str, List[Payload]], level: int, pairs: int, offset: int,
                rule: StabilityRule, window_s: float) -> List[dict]:
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


def capacity(points: List[dict], slo_ms: float) -> float:
    """The highest throughput of a stable point within the SLO (an unstable one sets no capacity)."""
    return max((p["throughput_rps"] for p in points if p["p99_ms"] <= slo_ms and not p["errors"]
                and p.get("stable", True)), default=0.0)


def _tail(point: dict) -> str:
    """A sweep point's p99 as a table cell (stats.tail_cell; older reports hold no count)."""
    return stats.tail_cell({"count": point.get("samples"), "p90_ms": point.get("p90_ms"),
                            "p99_ms": point["p99_ms"]}, 2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench.response_cache", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a catalogue model whose first example is JSON with one text field")
    parser.add_argument("--levels", default="1,2,4,8,16", help="closed-loop concurrencies")
    parser.add_argument("--universe", type=int, default=1000, help="distinct inputs of the Zipf workload")
    parser.add_argument("--zipf-s", type=float, default=1.1)
    parser.add_argument("--distinct", type=int, default=200_000, help="inputs available to the all-distinct workload")
    parser.add_argument("--window-s", type=float, default=3.0)
    parser.add_argument("--pairs", type=int, default=8, help="alternating all-distinct pairs at --pair-level")
    parser.add_argument("--pair-level", type=int, default=8, help="closed-loop concurrency of those pairs")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-mib", type=float, default=64)
    parser.add_argument("--out", type=Path, default=REPORTS)
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    entry = yaml.safe_load(CATALOGUE.read_text())["models"][args.model]
    slo_ms = float(entry.get("slo_ms", 100))
    template, field = text_field(entry, args.model)
    pool = sentences()
    if len(pool) < args.universe:
        raise SystemExit(f"error: only {len(pool)} distinct sentences for --universe {args.universe}")
    universe = pool[:args.universe]
    zipf = [universe[i] for i in zipf_order(args.universe, 200_000, args.zipf_s, seed=0)]
    # All distinct: pairs of sentences, none of them the Zipf universe's, never sent twice.
    rest = pool[args.universe:]
    distinct = [f"{rest[i % len(rest)]} {rest[(i // len(rest)) % len(rest)]}" for i in range(args.distinct)]
    distinct_workload = {"cache": payloads(template, field, distinct),
                         "no_cache": payloads(template, field, distinct, NO_CACHE)}
    rule = StabilityRule()
    when = time.strftime("%Y%m%d-%H%M%S")
    report = {"model": args.model, "when": when, "slo_ms": slo_ms, "levels": levels, "universe": args.universe,
              "zipf_s": args.zipf_s, "workers": args.workers, "batch_size": args.batch_size, "max_mib": args.max_mib,
              "command": "python -m benchmarks.bench.response_cache " + " ".join(argv if argv is not None else sys.argv[1:])}
    with tempfile.TemporaryDirectory(prefix="cachebench-") as tmp:
        with_cache(MODEL_STORE / f"{args.model}.mar", Path(tmp), args.model, args.max_mib)
        settings = {args.model: ModelSettings(batch_size=args.batch_size, max_batch_delay_ms=1,
                                                  min_workers=args.workers, max_workers=args.workers)}
        with TorchServe(Path(tmp), models=settings, load=(args.model,)) as server:
            target = Target.for_model(server.client.endpoints.inference, args.model, server.client.tokens.inference)
            answer = server.predict(args.model, distinct_workload["cache"][-1].body, "application/json").content
            log(f"all-distinct inputs: cache vs no-cache, levels {levels}")
            report["distinct"], sent = sweep(target, distinct_workload, levels, rule, args.window_s, distinct=True)
            log(f"all-distinct inputs: {args.pairs} alternating pairs at concurrency {args.pair_level}")
            report["distinct_pairs"] = paired_peak(target, distinct_workload, args.pair_level, args.pairs, sent, rule,
                                                   args.window_s)
            log(f"Zipf s={args.zipf_s} over {args.universe} inputs: cache vs no-cache, levels {levels}")
            report["zipf"], _ = sweep(target, {"cache": payloads(template, field, zipf),
                                            "no_cache": payloads(template, field, zipf, NO_CACHE)},
                                   levels, rule, args.window_s, distinct=False)
            report["metrics"] = {name: server_total(server, name, args.model)
                                 for name in ("ResponseCacheHits", "ResponseCacheMisses", "ResponseCacheEvictions",
                                              "ResponseCacheBytes")}
    report["cost"] = cache_cost(args.model, [p.body for p in distinct_workload["cache"][:10_000]], answer, args.max_mib)
    best = max(p["throughput_rps"] for p in report["distinct"]["no_cache"])  # one request's worker time, from it:
    report["cost"]["share_of_service"] = report["cost"]["us_per_request"] / (args.workers / best * 1e6)
    for workload in ("zipf", "distinct"):
        figures = {arm: capacity(points, slo_ms) for arm, points in report[workload].items()}
        figures["ratio"] = round(figures["cache"] / figures["no_cache"], 2) if figures["no_cache"] else None
        report[f"{workload}_capacity_rps"] = figures
    ratios = [p["ratio"] for p in report["distinct_pairs"]]
    report["distinct_pair_ratio"] = {"median": round(float(np.median(ratios)), 4), "min": min(ratios),
                                     "max": max(ratios), "level": args.pair_level}
    folder = args.out / f"response-cache-{args.model}-{when}"
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


def markdown(report: dict) -> str:
    lines = [f"# Response cache: {report['model']} ({report['when']})", "", f"Command: `{report['command']}`", "",
             f"One TorchServe, {report['workers']} workers, batchSize {report['batch_size']}, the archive with "
             f"`response_cache.max_mib: {report['max_mib']}`; \"no cache\" sends `Cache-Control: no-cache`. "
             f"Capacity: the highest closed-loop throughput of a stable point with p99 <= {report['slo_ms']:g} ms; "
             f"a p99 over fewer than {stats.P99_MIN_SAMPLES:,} requests is shown as the p90 and the count.", ""]
    for workload, title in (("zipf", f"Zipf s={report['zipf_s']} over {report['universe']} inputs"),
                            ("distinct", "all-distinct inputs (never a hit)")):
        cap = report[f"{workload}_capacity_rps"]
        lines += [f"## {title}", "", "| concurrency | cache req/s | cache p99 ms | no cache req/s | no cache p99 ms |",
                  "|---|---|---|---|---|"]
        for on, off in zip(report[workload]["cache"], report[workload]["no_cache"]):
            lines.append(f"| {on['concurrency']} | {on['throughput_rps']} | {_tail(on)} | {off['throughput_rps']} | "
                         f"{_tail(off)} |")
        lines += ["", f"Capacity at the SLO: cache {cap['cache']} req/s, no cache {cap['no_cache']} req/s: "
                      f"**{cap['ratio']}x**.", ""]
    pr = report["distinct_pair_ratio"]
    lines += [f"## All-distinct inputs, throughput at concurrency {pr['level']}, arms alternating", "",
              "| pair | cache req/s | no cache req/s | cache / no cache |", "|---|---|---|---|"]
    lines += [f"| {i + 1} | {p['cache']} | {p['no_cache']} | {p['ratio']:.3f} |"
              for i, p in enumerate(report["distinct_pairs"])]
    lines += ["", f"Median ratio **{pr['median']:.3f}** (range {pr['min']:.3f}-{pr['max']:.3f} over "
                  f"{len(report['distinct_pairs'])} pairs).", ""]
    cost = report["cost"]
    lines += [f"The cache's own work per request, in-process ({cost['requests']} distinct bodies, "
              f"{cost['answer_bytes']}-byte answers): **{cost['us_per_request']} us** (key + lookup + store; "
              f"runs {cost['runs_us']}). At the no-cache arm's best throughput per worker that is "
              f"{cost['share_of_service']:.2%} of a request's worker time.", ""]
    lines += [f"Server counters at the end: {report['metrics']}.", "", "![capacity](capacity.png)", ""]
    return "\n".join(lines)


def plot(report: dict, folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    ratios = [p["ratio"] for p in report["distinct_pairs"]]
    axes[2].bar(range(1, len(ratios) + 1), ratios, color="#2ca02c")
    axes[2].axhline(1.0, color="grey", linewidth=0.8)
    axes[2].axhline(0.97, color="red", linewidth=0.8, linestyle="--", label="3% slower")
    axes[2].set_ylim(min(0.85, min(ratios) - 0.02), max(1.15, max(ratios) + 0.02))
    axes[2].set_xlabel("alternating pair")
    axes[2].set_title(f"all-distinct, cache / no cache at concurrency {report['distinct_pair_ratio']['level']}")
    axes[2].legend()
    for ax, workload in zip(axes, ("zipf", "distinct")):
        for arm, style in (("cache", "o-"), ("no_cache", "s--")):
            points = report[workload][arm]
            ax.plot([p["throughput_rps"] for p in points], [p["p99_ms"] for p in points], style, label=arm)
        ax.axhline(report["slo_ms"], color="grey", linewidth=0.8)
        ax.set_xlabel("throughput, req/s")
        ax.set_title(workload)
        ax.legend()
    axes[0].set_ylabel("p99 latency, ms")
    fig.tight_layout()
    fig.savefig(folder / "capacity.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
