"""The generation engine's features served: speculation (off / draft model / prompt lookup at 1, 2 and
8 sequences), the prefix cache (a shared long prefix, hit against miss) and priorities (time to first
token per class, the server saturated by low-priority long generations)."""

from __future__ import annotations

import tempfile
import time
import zipfile
from pathlib import Path

from benchmarks.bench.generation_load import PROMPTS, log, probes, serving, settings_for, throughput, ttft_figures
from benchmarks.bench.generation_report import BLOCKS, SPECULATION
from benchmarks.load import stats
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.generation import Generators, generate
from serving.repo import MODEL_STORE

PRIORITY_PROBES = 50  # per class and block


def served_speculation(model: str, tmp: Path, new_tokens: int, mode: str, threads: int) -> dict:
    """Tokens/s at 1, 2 and 8 closed-loop clients for each speculation setting."""
    out = {}
    for speculation in SPECULATION:
        log(f"served speculation {speculation}: TorchServe, {mode} mode")
        with serving(tmp / f"spec-{speculation}", model, {"speculation": speculation, "prefix_cache_mib": 0,
                                                          "mode": mode}, settings_for(mode, 8, threads=threads)) as server:
            probes(server, model, 3)
            out[speculation] = {}
            for clients, rounds in ((1, 12), (2, 8), (8, 4)):
                result = throughput(server, model, clients, new_tokens, rounds)
                out[speculation][str(clients)] = result["tokens_per_s"]
                log(f"  {speculation}, {clients} client(s): {result['tokens_per_s']} tokens/s")
    out["ratios"] = {s: {c: round(out[s][c] / out["off"][c], 2) for c in out["off"]} for s in SPECULATION[1:]}
    return out


def shared_prefix_prompts(tokenizer, prefix_tokens: int, misses: int) -> tuple:
    """A prompt with a shared `prefix_tokens`-token prefix, and `misses` prompts with prefixes of
    the same length that share nothing (other stretches of the same documentation)."""
    from pydoc_data.topics import topics

    ids = tokenizer.encode("\n\n".join(topics[name] for name in sorted(topics))).ids
    question = "\n\nQuestion: what does the for statement do?\nAnswer:"
    starts = [0, *range(prefix_tokens + 7, len(ids) - prefix_tokens, (len(ids) - prefix_tokens) // (misses + 2))]
    if len(starts) < misses + 1:
        raise BenchmarkError("the documentation text is too short for that many distinct prefixes")
    texts = [tokenizer.decode(ids[s:s + prefix_tokens]) + question for s in starts[:misses + 1]]
    return texts[0], texts[1:]


def prefix_experiment(model: str, tmp: Path, count: int, prefix_tokens: int, mode: str, threads: int) -> dict:
    from tokenizers import Tokenizer

    with zipfile.ZipFile(MODEL_STORE / f"{model}.mar") as archive:
        tokenizer = Tokenizer.from_str(archive.read("tokenizer.json").decode())
    shared, others = shared_prefix_prompts(tokenizer, prefix_tokens, count)
    log(f"prefix cache: {count} hits and {count} misses, alternating, {prefix_tokens}-token prefixes")
    hits, misses = [], []
    with serving(tmp / "prefix", model, {"speculation": "off", "prefix_cache_mib": 64, "mode": mode},
                 settings_for(mode, 8, threads=threads)) as server:
        probes(server, model, 3)
        request = {"prompt": shared, "max_new_tokens": 8}
        first = generate(server.client, model, request)  # a miss: the prefix is now cached
        for i in range(count):
            for prompt, into in ((shared, hits), (others[i], misses)):
                result = generate(server.client, model, {**request, "prompt": prompt})
                if not result.ok:
                    raise BenchmarkError(f"prefix probe failed: {result.status} {result.error}")
                into.append(result)
            if (i + 1) % 50 == 0:
                log(f"  {i + 1}/{count} pairs")
    out = {"prefix_tokens": prefix_tokens, "prompt_tokens": len(tokenizer.encode(shared).ids),
           "hit": ttft_figures(hits), "miss": ttft_figures(misses),
           "hit_answers_equal_the_miss": all(r.text == first.text for r in hits)}
    out["miss_over_hit_p50"] = round(out["miss"]["p50_ms"] / out["hit"]["p50_ms"], 2)
    out["miss_over_hit_p99"] = round(out["miss"]["p99_ms"] / out["hit"]["p99_ms"], 2)
    log(f"  TTFT p50 hit {out['hit']['p50_ms']} ms, miss {out['miss']['p50_ms']} ms: {out['miss_over_hit_p50']}x")
    return out


def priority_experiment(model: str, tmp: Path, load_clients: int, max_running: int, long_tokens: int,
                        mode: str, threads: int) -> dict:
    """High-priority short requests on an idle server and with `load_clients` low-priority long
    generations (more than max_running: some wait); low-priority short ones beside them."""
    batch = 2 * load_clients  # the frontend hands over every request in flight: none waits in its FIFO queue
    high, low = {"X-Priority": "high"}, {"X-Priority": "low"}
    long_body = {"prompt": PROMPTS[1], "max_new_tokens": long_tokens, "ignore_eos": True}
    idle, busy, busy_low, background = [], [], [], []
    with serving(tmp / "priority", model, {"max_running": max_running, "prefix_cache_mib": 0, "mode": mode},
                 settings_for(mode, batch, threads=threads)) as server:
        probes(server, model, 3)
        for block in range(BLOCKS):
            log(f"priorities, block {block + 1}/{BLOCKS}: idle, then {load_clients} low-priority long generations "
                f"({max_running} run at once)")
            idle.extend(probes(server, model, PRIORITY_PROBES, high))
            started = time.perf_counter()
            with Generators(server.client, model, load_clients, lambda c, i: long_body, stream=False,
                            headers=low) as load:
                time.sleep(1.0)
                busy.extend(probes(server, model, PRIORITY_PROBES, high))
                busy_low.extend(probes(server, model, PRIORITY_PROBES // 5, low))
                finished = load.stop()
            background.append((finished, time.perf_counter() - started))
    done = [r for results, _ in background for r in results]
    if any(not r.ok for r in done):
        raise BenchmarkError("a low-priority long generation failed")
    seconds = sum(s for _, s in background)
    out = {"load_clients": load_clients, "max_running": max_running, "batch_size": batch,
           "high_idle": ttft_figures(idle), "high_busy": ttft_figures(busy), "low_busy": ttft_figures(busy_low),
           "low_long_completed": len(done), "low_long_tokens_per_s": round(sum(r.generated_tokens for r in done) / seconds, 1)}
    out["high_busy_over_idle_p99"] = round(out["high_busy"]["p99_ms"] / out["high_idle"]["p99_ms"], 2)
    log(f"  high TTFT idle {stats.tail_text(out['high_idle'], 2)}, busy {stats.tail_text(out['high_busy'], 2)} "
        f"({stats.tail_ratio(out['high_busy'], out['high_idle'])}); low p50 {out['low_busy']['p50_ms']} ms; "
        f"{len(done)} long low generations completed")
    return out


def served_features(model: str, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="genbench-stores-") as tmp:
        return {"mode": args.mode, "threads": args.threads,
                "speculation": served_speculation(model, Path(tmp), args.spec_tokens, args.mode, args.threads),
                "prefix": prefix_experiment(model, Path(tmp), args.prefix_probes, args.prefix_tokens, args.mode,
                                            args.threads),
                "priority": priority_experiment(model, Path(tmp), args.low_clients, args.max_running, args.long_tokens,
                                                args.mode, args.threads)}
