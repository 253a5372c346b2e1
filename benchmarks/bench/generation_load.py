"""A generating model served for a measurement: what is sent, how it is timed, and a server of a copy
of the archive with its `causal_lm` settings changed."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from benchmarks.bench.archive_settings import with_handler_settings
from benchmarks.bench.generation_report import BLOCKS
from benchmarks.load import cli, stats
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.generation import GenerationResult, Generators, generate
from benchmarks.load.stats import percentile
from serving.launcher import TorchServe
from serving.repo import MODEL_STORE
from serving.ts_config import ModelSettings

PROMPTS = ["The for statement is used to", "A class definition defines", "When a name is not found",
           "The import statement", "Exceptions are raised when", "An object is",
           "The with statement is used to", "Assignment statements are used to"]
# The KV cache and continuous batching compared alone: speculation and the prefix cache have their own rows.
PLAIN = {"speculation": "off", "prefix_cache_mib": 0}

log = cli.progress("generation")


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


def probes(server: TorchServe, model: str, count: int, headers: Optional[dict] = None) -> list[GenerationResult]:
    """Short streamed requests, one after another."""
    out = []
    for i in range(count):
        result = generate(server.client, model, {"prompt": PROMPTS[i % len(PROMPTS)], "max_new_tokens": 4},
                          headers=headers)
        if not result.ok:
            raise BenchmarkError(f"probe failed: {result.status} {result.error}")
        out.append(result)
    return out


def ttft_figures(results: list[GenerationResult]) -> dict:
    values = sorted(1000 * r.ttft_s for r in results)
    return {"count": len(values), "p50_ms": round(percentile(values, 50), 2), "p90_ms": round(percentile(values, 90), 2),
            "p99_ms": round(percentile(values, 99), 2), "max_ms": round(values[-1], 2),
            "values_ms": [round(v, 2) for v in values]}


def ttft_blocks(server: TorchServe, model: str, clients: int, probes_each: int, long_tokens: int) -> dict:
    """Short requests idle and with clients-1 long generations running, in alternating blocks, so a
    slow spell of the machine falls on both. The long ones are not streamed: the server runs them the
    same, and client threads parsing every chunk would compete with the probe for this interpreter."""
    idle, busy, background = [], [], 0
    long_body = {"prompt": PROMPTS[1], "max_new_tokens": long_tokens, "ignore_eos": True}
    for block in range(BLOCKS):
        log(f"  TTFT block {block + 1}/{BLOCKS}: idle, then {clients - 1} long generations running")
        idle.extend(probes(server, model, probes_each // BLOCKS))
        with Generators(server.client, model, clients - 1, lambda c, i: long_body, stream=False) as load:
            time.sleep(1.0)  # the long ones are all running
            busy.extend(probes(server, model, probes_each // BLOCKS))
            background += len(load.stop())
    out = {"ttft_idle": ttft_figures(idle), "ttft_busy": ttft_figures(busy)}
    out["ttft_busy"]["background_requests"] = background
    log(f"  TTFT idle {stats.tail_text(out['ttft_idle'], 2)}, busy {stats.tail_text(out['ttft_busy'], 2)}")
    return out


def settings_for(mode: str, clients: int, workers: int = 1, threads: int = 0) -> ModelSettings:
    """Step mode: the batch is the frontend's (batchSize sequences, one worker). Async: the frontend
    forwards each request as it comes (batchSize 1) and the worker's loop batches them."""
    batch = clients if mode == "step" else 1
    return ModelSettings(batch_size=batch, max_batch_delay_ms=1, min_workers=workers, max_workers=workers,
                         threads=threads or None)


def serving(store: Path, model: str, causal_lm: dict, settings: ModelSettings) -> TorchServe:
    """A TorchServe of a copy of the archive in `store` with these causal_lm settings changed."""
    with_handler_settings(MODEL_STORE / f"{model}.mar", store, model, {"causal_lm": causal_lm})
    return TorchServe(store, models={model: settings}, load=(model,))
