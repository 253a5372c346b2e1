"""What the generation benchmarks send to a served causal LM, and how they time it: the prompts,
closed-loop throughput, short streamed probes and their time-to-first-token figures."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.load.generation import GenerationResult, generate
from benchmarks.load.stats import percentile
from serving.errors import BenchmarkError
from serving.launcher import TorchServe

PROMPTS = ["The for statement is used to", "A class definition defines", "When a name is not found",
           "The import statement", "Exceptions are raised when", "An object is",
           "The with statement is used to", "Assignment statements are used to"]


def log(message: str) -> None:
    print(f"[generation-bench] {message}", file=sys.stderr, flush=True)


def body(i: int, new_tokens: int) -> dict:
    return {"prompt": PROMPTS[i % len(PROMPTS)], "max_new_tokens": new_tokens, "ignore_eos": True}


def throughput(server: TorchServe, model: str, clients: int, new_tokens: int, rounds: int,
               timeout_s: float = 300.0) -> dict:
    """`clients` closed-loop clients, each generating `new_tokens` tokens `rounds` times."""
    def client(c: int) -> list[GenerationResult]:
        return [generate(server.client, model, body(c + i, new_tokens), timeout_s=timeout_s) for i in range(rounds)]

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = [r for batch in pool.map(client, range(clients)) for r in batch]
    wall = time.perf_counter() - started
    failed = [r for r in done if not r.ok]
    if failed:
        raise BenchmarkError(f"{len(failed)} generation request(s) failed: {failed[0].status} {failed[0].error}")
    tokens = sum(r.generated_tokens for r in done)
    ttft, gaps = sorted(r.ttft_s for r in done), sorted(g for r in done for g in r.gaps_s)
    # The p90s and counts beside the p99s: a report prints a thin p99 as its p90 (stats.tail_text).
    return {"clients": clients, "requests": len(done), "tokens": tokens, "seconds": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 1),
            "ttft_p50_ms": round(1000 * percentile(ttft, 50), 1),
            "ttft_p90_ms": round(1000 * percentile(ttft, 90), 1),
            "ttft_p99_ms": round(1000 * percentile(ttft, 99), 1),
            "inter_chunk_p90_ms": round(1000 * percentile(gaps, 90), 2),
            "inter_chunk_p99_ms": round(1000 * percentile(gaps, 99), 2),
            "inter_chunk_count": len(gaps)}


def probes(server: TorchServe, model: str, count: int) -> list[GenerationResult]:
    """Short streamed requests, one after another."""
    out = []
    for i in range(count):
        result = generate(server.client, model, {"prompt": PROMPTS[i % len(PROMPTS)], "max_new_tokens": 4})
        if not result.ok:
            raise BenchmarkError(f"probe failed: {result.status} {result.error}")
        out.append(result)
    return out


def ttft_figures(results: list[GenerationResult]) -> dict:
    values = sorted(1000 * r.ttft_s for r in results)
    return {"count": len(values), "p50_ms": round(percentile(values, 50), 2), "p90_ms": round(percentile(values, 90), 2),
            "p99_ms": round(percentile(values, 99), 2), "max_ms": round(values[-1], 2), "values_ms": [round(v, 2) for v in values]}
