"""Benchmark a causal-LM (generating) model in one run, one report: in-process, the KV cache against
recomputation, the engine by intra-op threads and speculative decoding; served, continuous batching
against one sequence at a time on the same archive, time to first token of a short request on an
idle server and on one busy with long generations; then (`--parts`) the asynchronous worker mode
against the step-per-call mode and the async mode's worker layouts, OpenAI's client against
/predictions (first token), and the engine's features served: speculation (off / draft model /
prompt lookup at 1, 2 and 8 sequences), the prefix cache (a shared 1,000-token prefix, hit against
miss) and priorities (time to first token per class, the server saturated by low-priority long
generations). Each served part runs a copy of the archive with its `causal_lm` settings changed.

    python -m benchmarks generation --model tinylm
    make bench MODEL=tinylm            (the bench sends generating families here)

Writes benchmarks/reports/generation-<model>-<time>/ (report.json, report.md, PNG plots).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from benchmarks.bench import generation_report as report_of
from benchmarks.bench.archive_settings import with_handler_settings
from benchmarks.bench.generation_report import BLOCKS, SECOND_THREAD, SPECULATION, TWO_WORKERS
from benchmarks.bench.inprocess import extracted_archive
from benchmarks.load import cli, stats
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.generation import GenerationResult, Generators, generate
from benchmarks.load.stats import percentile
from build.catalogue import Catalogue
from serving.fake_context import FakeContext
from serving.launcher import TorchServe
from serving.repo import CATALOGUE, MODEL_STORE, shown
from serving.ts_config import ModelSettings

PROMPTS = ["The for statement is used to", "A class definition defines", "When a name is not found",
           "The import statement", "Exceptions are raised when", "An object is",
           "The with statement is used to", "Assignment statements are used to"]
# The KV cache and continuous batching compared alone: speculation and the prefix cache have their own rows.
PLAIN = {"speculation": "off", "prefix_cache_mib": 0}
MODES = ("step", "async")
THREADS = (1, 2)  # one worker's intra-op threads, each mode at each
PRIORITY_PROBES = 50  # per class and block
MESSAGES = [{"role": "system", "content": "You answer about Python."},
            {"role": "user", "content": "What does the for statement do?"}]

log = cli.progress("generation")


# ---- what is sent and how it is timed -------------------------------------------------------------
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


# ---- in-process ----------------------------------------------------------------------------------
def inprocess(model: str, new_tokens: int, repeats: int, clients: int) -> dict:
    """KV cache vs recomputing every step, one sequence, `new_tokens` tokens (ignore_eos), same handler."""
    from handlers.handler import Handler

    with tempfile.TemporaryDirectory(prefix="genbench-") as tmp:
        model_dir = extracted_archive(model, None, Path(tmp))
        handler = Handler()
        handler.initialize(FakeContext(model_dir, model, batch_size=8, handler_overrides={"causal_lm": PLAIN}))
        engine, family = handler.generation.engine, handler.family
        request = family.decode(body(0, new_tokens), "")
        rates: dict[str, list[float]] = {"kv_cache": [], "recompute": []}
        same = True
        for r in range(repeats):
            started = time.perf_counter()
            cached = engine.generate([("kv", request)])["kv"]
            rates["kv_cache"].append(new_tokens / (time.perf_counter() - started))
            started = time.perf_counter()
            recomputed = engine.generate_without_cache(request)
            rates["recompute"].append(new_tokens / (time.perf_counter() - started))
            same = same and cached.text.ids == recomputed.text.ids
            log(f"in-process {r + 1}/{repeats}: KV cache {rates['kv_cache'][-1]:.0f} tokens/s, "
                f"recompute {rates['recompute'][-1]:.0f} tokens/s")
        batch = {}
        for size in (1, 8):
            started = time.perf_counter()
            engine.generate(batch_requests(family, size, new_tokens))
            batch[str(size)] = round(size * new_tokens / (time.perf_counter() - started), 1)
        by_threads = engine_by_threads(engine, family, clients, new_tokens, repeats)
        threads = handler.threads
        speculation = inprocess_speculation(handler, model_dir, new_tokens, repeats)
    kv, recompute = statistics.median(rates["kv_cache"]), statistics.median(rates["recompute"])
    return {"new_tokens": new_tokens, "threads": threads, "repeats": repeats,
            "kv_cache_tokens_per_s": [round(x, 1) for x in rates["kv_cache"]],
            "recompute_tokens_per_s": [round(x, 1) for x in rates["recompute"]],
            "speedup": round(kv / recompute, 2), "speedup_min": round(min(rates["kv_cache"]) / max(rates["recompute"]), 2),
            "same_tokens": same, "batched_tokens_per_s": batch, "batch_size": clients, "batch_by_threads": by_threads,
            "speculation": speculation}


def batch_requests(family, size: int, new_tokens: int) -> list:
    return [(f"b{i}", family.decode(body(i, new_tokens), "")) for i in range(size)]


def engine_by_threads(engine, family, size: int, new_tokens: int, repeats: int) -> dict:
    """The engine's tokens/s at `size` sequences (median of `repeats`) with 1 and 2 intra-op threads
    from the main thread, and with 2 from a second thread, as a worker's engine would run there."""
    import threading

    import torch

    def rate() -> float:
        runs = []
        for _ in range(repeats):
            started = time.perf_counter()
            engine.generate(batch_requests(family, size, new_tokens))
            runs.append(size * new_tokens / (time.perf_counter() - started))
        return round(statistics.median(runs), 1)

    before = torch.get_num_threads()
    out = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out[str(threads)] = rate()
        second: list[float] = []
        worker = threading.Thread(target=lambda: second.append(rate()), name="second-thread")
        worker.start()
        worker.join()
        out[SECOND_THREAD] = second[0]
    finally:
        torch.set_num_threads(before)
    log(f"in-process, {size} sequences: " + ", ".join(f"{k}: {v} tokens/s" for k, v in out.items()))
    return out


def repeated_paragraph_prompt() -> str:
    from pydoc_data.topics import topics

    paragraph = topics["if"][:600]
    return paragraph + "\n\nAgain:\n\n" + paragraph[:80]


def inprocess_speculation(handler, model_dir: Path, new_tokens: int, repeats: int) -> dict:
    """One greedy sequence, speculation off / draft / lookup, same model, same prompt."""
    from handlers.generation.drafting import LookupDrafter, load_drafter
    from handlers.generation.engine import Engine

    base, family = handler.generation.engine, handler.family
    drafters = {"off": None, "draft": load_drafter("draft", model_dir, family.settings.draft_model),
                "lookup": LookupDrafter()}
    engines = {mode: Engine(base.lm, base.decode, base.eos_ids, base.max_positions, base.autocast_dtype,
                            drafter=drafter, max_draft_tokens=family.settings.max_draft_tokens)
               for mode, drafter in drafters.items()}
    out = {}
    for label, prompt in (("plain", PROMPTS[0]), ("repeats its context", repeated_paragraph_prompt())):
        request = family.decode({"prompt": prompt, "max_new_tokens": new_tokens, "ignore_eos": True}, "")
        rates: dict[str, list[float]] = {mode: [] for mode in SPECULATION}
        last = {}
        for _ in range(repeats):
            for mode, engine in engines.items():
                started = time.perf_counter()
                last[mode] = engine.generate([("s", request)])["s"]
                rates[mode].append(new_tokens / (time.perf_counter() - started))
        off = statistics.median(rates["off"])
        out[label] = {"prompt_tokens": len(request.prompt_ids),
                      **{f"{m}_tokens_per_s": [round(x, 1) for x in rates[m]] for m in SPECULATION},
                      **{f"{m}_speedup": round(statistics.median(rates[m]) / off, 2) for m in SPECULATION[1:]},
                      **{f"{m}_acceptance": round(last[m].draft.accepted / max(1, last[m].draft.proposed), 2)
                         for m in SPECULATION[1:]},
                      "same_tokens": all(last[m].generated_ids == last["off"].generated_ids for m in SPECULATION)}
        log(f"speculation in-process ({label}): draft {out[label]['draft_speedup']}x "
            f"(acceptance {out[label]['draft_acceptance']}), lookup {out[label]['lookup_speedup']}x, "
            f"same tokens {out[label]['same_tokens']}")
    return out


# ---- served: continuous batching, modes, OpenAI -------------------------------------------------
def served(model: str, args) -> dict:
    """One sequence at a time against continuous batching, same archive and load, in `args.mode`:
    step mode's batchSize 1 against batchSize = clients; the async mode's max_running 1 (the
    worker runs one sequence, the others wait) against no cap."""
    out = {"mode": args.mode, "threads": args.threads}
    with tempfile.TemporaryDirectory(prefix="genbench-plain-") as tmp:
        for label, one in (("batch_size_1", True), ("continuous", False)):
            cap = {"max_running": 1 if one else 0} if args.mode == "async" else {}
            settings = settings_for(args.mode, 1 if one else args.clients, threads=args.threads)
            how = f"max_running {cap['max_running']}" if cap else f"batchSize {settings.batch_size}"
            log(f"served, {label}: {args.mode} mode, 1 worker x {args.threads} thread(s), {how}")
            with serving(Path(tmp) / label, model, {**PLAIN, "mode": args.mode, **cap}, settings) as server:
                probes(server, model, 3)  # warm the path
                out[label] = throughput(server, model, args.clients, args.new_tokens, args.rounds)
                log(f"  {args.clients} clients x {args.rounds} x {args.new_tokens} tokens: "
                    f"{out[label]['tokens_per_s']} tokens/s")
                if not one:
                    out.update(ttft_blocks(server, model, args.clients, args.probes, args.long_tokens))
    out["continuous_over_batch_1"] = round(out["continuous"]["tokens_per_s"] / out["batch_size_1"]["tokens_per_s"], 2)
    out["ttft_busy_over_idle_p99"] = round(out["ttft_busy"]["p99_ms"] / out["ttft_idle"]["p99_ms"], 2)
    return out


def compare_modes(model: str, args, engine_by_threads: dict) -> dict:
    """Tokens/s of the async and step modes on one worker at 1 and 2 intra-op threads, each next to
    the in-process engine at the same threads; time to first token of both modes at `args.threads`;
    then the async mode on two workers of one thread."""
    out = {"modes": {}, "clients": args.clients, "probes": args.probes, "ttft_threads": args.threads}
    with tempfile.TemporaryDirectory(prefix="genbench-modes-") as tmp:
        for mode in MODES:
            for threads in THREADS:
                log(f"mode {mode}: 1 worker x {threads} thread(s), {args.clients} streaming clients x {args.rounds} x "
                    f"{args.new_tokens} tokens")
                with serving(Path(tmp) / mode, model, {**PLAIN, "mode": mode},
                             settings_for(mode, args.clients, threads=threads)) as server:
                    probes(server, model, 3)  # warm the path
                    figures = throughput(server, model, args.clients, args.new_tokens, args.rounds)
                    figures["threads"] = server_threads(server, model)
                    log(f"  {figures['tokens_per_s']} tokens/s ({figures['threads']} thread(s))")
                    if threads == args.threads:
                        figures.update(ttft_blocks(server, model, args.clients, args.probes, args.long_tokens))
                figures["step_ms"] = round(1000 * args.clients / figures["tokens_per_s"], 2)
                engine = engine_by_threads.get(str(figures["threads"]))
                figures["over_inprocess"] = round(figures["tokens_per_s"] / engine, 2) if engine else None
                out["modes"].setdefault(mode, {})[str(threads)] = figures
        log(f"async, {TWO_WORKERS}: {args.clients} clients")
        with TorchServe(Path(tmp) / "async", models={model: settings_for("async", args.clients, 2, 1)},
                        load=(model,)) as server:
            probes(server, model, 3)
            out["two_workers"] = throughput(server, model, args.clients, args.new_tokens, args.rounds)
        log(f"  {out['two_workers']['tokens_per_s']} tokens/s")
    out["engine_by_threads"] = engine_by_threads
    out["async_over_step"] = {t: round(out["modes"]["async"][t]["tokens_per_s"] / out["modes"]["step"][t]["tokens_per_s"], 2)
                              for t in out["modes"]["async"]}
    best = {mode: max(runs.values(), key=lambda f: f["tokens_per_s"]) for mode, runs in out["modes"].items()}
    out["best_over_best"] = round(best["async"]["tokens_per_s"] / best["step"]["tokens_per_s"], 2)
    for runs in out["modes"].values():
        for figures in runs.values():
            if "ttft_idle" in figures:
                figures["ttft_busy_over_idle"] = stats.tail_ratio(figures["ttft_busy"], figures["ttft_idle"])
    return out


def server_threads(server: TorchServe, model: str) -> int:
    """The intra-op threads the worker chose (its ready line in the model log)."""
    found = re.search(rf"{re.escape(model)} ready in .*? threads=(\d+)", server.log_text())
    if found is None:
        raise BenchmarkError(f"{model}: the worker's ready line (threads=) is not in its log")
    return int(found.group(1))


def _openai_first_token(client, model: str, tokens: int) -> GenerationResult:
    """One streamed chat; its first chunk with text counts, as a user's first visible token."""
    sent = time.perf_counter()
    first, text, count = None, "", 0
    for chunk in client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=tokens, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True}):
        piece = chunk.choices[0].delta.content if chunk.choices else None
        if piece:
            first = first or time.perf_counter()
            text += piece
            count += 1
    return GenerationResult(200, sent, (first,) if first else (), time.perf_counter(), text, count, "length")


def compare_openai(model: str, tokens: int, pairs: int) -> dict:
    """The first token of a streamed chat through OpenAI's own client against the first NDJSON line
    of the same request on /predictions (the prompt the chat template renders), async mode, one
    request at a time, the two kinds alternating. The client is created once: the request is timed."""
    import openai

    from handlers.openai.chat_template import render

    prompt = render(MESSAGES, None)  # the model has no chat template of its own: the plain one
    with tempfile.TemporaryDirectory(prefix="genbench-openai-") as tmp:
        with serving(Path(tmp) / "async", model, {**PLAIN, "mode": "async"},
                     ModelSettings(batch_size=1, max_batch_delay_ms=1)) as server:
            version = Catalogue.load(CATALOGUE).entry(model).version  # OpenAI's paths come after a version
            client = openai.OpenAI(base_url=f"{server.inference_url}/predictions/{model}/{version}/v1",
                                   api_key=server.tokens.inference, max_retries=0, timeout=120)
            request = {"prompt": prompt, "max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}
            chat, ndjson = [], []
            for i in range(pairs):
                if i % 100 == 0:
                    log(f"  openai vs /predictions: pair {i + 1}-{min(i + 100, pairs)} of {pairs}")
                ndjson.append(generate(server.client, model, request, stream=True))
                chat.append(_openai_first_token(client, model, tokens))
            failed = [r for r in ndjson if not r.ok]
            if failed:
                raise BenchmarkError(f"/predictions request failed: {failed[0].status} {failed[0].error}")
    out = {"tokens": tokens, "pairs": pairs, "openai_chat": ttft_figures(chat), "predictions_ndjson": ttft_figures(ndjson)}
    out["p50_ratio"] = round(out["openai_chat"]["p50_ms"] / out["predictions_ndjson"]["p50_ms"], 2)
    out["tail_ratio"] = stats.tail_ratio(out["openai_chat"], out["predictions_ndjson"])
    return out


# ---- served: the engine's features ----------------------------------------------------------------
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


# ---- command line ---------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = cli.parser("generation", __doc__.split("\n\n")[0].replace("\n", " "))
    cli.add(p, "out", model={"default": "tinylm"},
            threads={"default": 1, "help": "intra-op threads of the one worker in the served runs (1: on two cores "
                                           "the layout that serves the most; the modes part measures 1 and 2)"})
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (= the batch's sequences)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens per request in the throughput runs")
    p.add_argument("--rounds", type=int, default=6, help="requests per client in the throughput runs")
    p.add_argument("--parts", type=lambda t: set(t.split(",")), default={"modes", "openai", "features"},
                   help="what to run after the in-process and served rows: modes (async against step, the async "
                        "mode's workers), openai (first token through OpenAI's client against /predictions), "
                        "features (speculation, prefix cache, priorities)")
    p.add_argument("--openai-pairs", type=int, default=1000, help="requests of each kind in the openai part")
    p.add_argument("--openai-tokens", type=int, default=64)
    p.add_argument("--probes", type=int, default=2000,
                   help="short requests per TTFT distribution (a report prints a p99 over fewer than 1,000 as the "
                        "p90 and the count)")
    p.add_argument("--long-tokens", type=int, default=256, help="tokens of the background generations")
    p.add_argument("--inprocess-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5, help="in-process repeats of each path")
    p.add_argument("--mode", choices=MODES, default="async",
                   help="how TorchServe drives the engine in the served runs (the modes part serves both)")
    p.add_argument("--spec-tokens", type=int, default=128, help="tokens per request, served speculation")
    p.add_argument("--prefix-probes", type=int, default=200,
                   help="hit / miss pairs (reports print a p99 over fewer than 1,000 as the p90 and n)")
    p.add_argument("--prefix-tokens", type=int, default=1000)
    p.add_argument("--low-clients", type=int, default=8, help="low-priority long generations at once")
    p.add_argument("--max-running", type=int, default=4, help="causal_lm.max_running in the priority run")
    return p


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    when = cli.stamp()
    folder = cli.report_folder(args.out, "generation", args.model, when=when)
    log(f"in-process: KV cache vs recompute, {args.inprocess_tokens} tokens")
    report = {"model": args.model, "when": when,
              "clients": args.clients, "new_tokens": args.new_tokens, "command": cli.command_line("generation", argv),
              "inprocess": inprocess(args.model, args.inprocess_tokens, args.repeats, args.clients)}
    report["served"] = served(args.model, args)
    if "modes" in args.parts:
        report["modes_compared"] = compare_modes(args.model, args, report["inprocess"]["batch_by_threads"])
    if "openai" in args.parts:
        log(f"OpenAI's client against /predictions: {args.openai_pairs} pairs")
        report["openai_compared"] = compare_openai(args.model, args.openai_tokens, args.openai_pairs)
    if "features" in args.parts:
        report["further"] = served_features(args.model, args)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    text = report_of.markdown(report)
    (folder / "report.md").write_text(text)
    report_of.plots(report, folder)
    log(f"report: {shown(folder / 'report.md')}")
    print(text)
    return 0
