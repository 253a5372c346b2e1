"""The generation benchmark's mode comparison: one archive served in TorchServe's asynchronous
worker mode (the engine loop steps at its own speed) against the step-per-call mode (continuous
batching: one frontend round trip per decoding step), the same load on each, in one run.

Per mode: tokens/s of `--clients` streaming clients (and the served time per step at that batch,
next to the in-process engine's), and time to first token of a short request on the idle server
and with clients-1 long generations running, in alternating blocks. Then the async mode's workers:
two workers of one thread against one of two threads.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

from benchmarks.bench.archive_settings import with_handler_settings
from benchmarks.bench.generation_probes import PROMPTS, log, probes, throughput, ttft_figures
from benchmarks.load import stats
from benchmarks.load.generation import Generators
from serving.errors import BenchmarkError
from serving.launcher import TorchServe
from serving.repo import MODEL_STORE
from serving.ts_config import ModelSettings

MODES = ("step", "async")
# The KV cache and batching alone: speculation and the prefix cache have their own rows.
PLAIN = {"speculation": "off", "prefix_cache_mib": 0}
BLOCKS = 4


def settings_for(mode: str, clients: int, workers: int = 1, threads: int = 0) -> ModelSettings:
    """Step mode: the batch is the frontend's (batchSize sequences, one worker). Async: the frontend
    forwards each request as it comes (batchSize 1) and the worker's loop batches them."""
    batch = clients if mode == "step" else 1
    return ModelSettings(batch_size=batch, max_batch_delay_ms=1, min_workers=workers, max_workers=workers,
                         threads=threads or None)


def ttft_blocks(server: TorchServe, model: str, clients: int, probes_each: int, long_tokens: int) -> dict:
    """Short requests idle and with clients-1 long generations running, in alternating blocks, so a
    slow spell of the machine falls on both."""
    idle, busy, background = [], [], 0
    long_body = {"prompt": PROMPTS[1], "max_new_tokens": long_tokens, "ignore_eos": True}
    for block in range(BLOCKS):
        log(f"    TTFT block {block + 1}/{BLOCKS}: {probes_each // BLOCKS} idle, then as many with "
            f"{clients - 1} long generations running")
        idle.extend(probes(server, model, probes_each // BLOCKS))
        with Generators(server.client, model, clients - 1, lambda c, i: long_body, stream=False) as load:
            time.sleep(1.0)  # the long ones are all running
            busy.extend(probes(server, model, probes_each // BLOCKS))
            background += len(load.stop())
    out = {"ttft_idle": ttft_figures(idle), "ttft_busy": ttft_figures(busy)}
    out["ttft_busy"]["background_requests"] = background
    return out


THREADS = (1, 2)  # one worker's intra-op threads, each mode at each
TWO_WORKERS = "2 workers x 1 thread"  # the async mode's other layout on two cores


def compare(model: str, args, engine_by_threads: dict) -> dict:
    """Tokens/s of both modes on one worker at 1 and 2 intra-op threads, each next to the in-process
    engine at the same threads; time to first token of both modes at `args.threads`; then the async
    mode on two workers of one thread. Ratios measured in this run."""
    out = {"modes": {}, "clients": args.clients, "probes": args.probes, "ttft_threads": args.threads}
    with tempfile.TemporaryDirectory(prefix="genbench-modes-") as tmp:
        for mode in MODES:
            store = Path(tmp) / mode
            with_handler_settings(MODEL_STORE / f"{model}.mar", store, model, {"causal_lm": {**PLAIN, "mode": mode}})
            for threads in THREADS:
                log(f"mode {mode}: 1 worker x {threads} thread(s), {args.clients} streaming clients x {args.rounds} x "
                    f"{args.new_tokens} tokens")
                with TorchServe(store, models={model: settings_for(mode, args.clients, threads=threads)},
                                load=(model,)) as server:
                    probes(server, model, 3)  # warm the path
                    figures = throughput(server, model, args.clients, args.new_tokens, args.rounds)
                    figures["threads"] = server_threads(server, model)
                    log(f"  {figures['tokens_per_s']} tokens/s ({figures['threads']} thread(s))")
                    if threads == args.threads:
                        figures.update(ttft_blocks(server, model, args.clients, args.probes, args.long_tokens))
                        log(f"  TTFT idle {stats.tail_text(figures['ttft_idle'])}, busy "
                            f"{stats.tail_text(figures['ttft_busy'])}")
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


def markdown(report: dict) -> list[str]:
    m = report.get("modes_compared")
    if not m:
        return []
    rows = [f"| {mode} | {t} | {f['tokens_per_s']} | {f['step_ms']} | {f['over_inprocess']}x |"
            for mode, runs in m["modes"].items() for t, f in runs.items()]
    ttft = [f"| {mode} | {stats.tail_cell(f['ttft_idle'])} | {stats.tail_cell(f['ttft_busy'])} | {f['ttft_busy_over_idle']} |"
            for mode, runs in m["modes"].items() for f in runs.values() if "ttft_idle" in f]
    engine = m["engine_by_threads"]
    ratios = ", ".join(f"{r}x at {t} thread(s)" for t, r in m["async_over_step"].items())
    return [
        "## Asynchronous worker mode against the step-per-call mode (same archive, same load)", "",
        f"{m['clients']} streaming clients on one worker. The in-process engine at {m['clients']} sequences (tokens/s): "
        + ", ".join(f"{v} ({k if ',' in k else k + ' thread(s)'})" for k, v in engine.items()) + ".", "",
        "| mode | threads | tokens/s | ms per step (served) | / in-process, same threads |",
        "|---|---|---|---|---|", *rows, "",
        f"Async over step: {ratios}; each mode at its best: **{m['best_over_best']}x**. Async on "
        f"{TWO_WORKERS}: {m['two_workers']['tokens_per_s']} tokens/s.", "",
        f"Time to first token at {m['ttft_threads']} thread(s): {m['probes']} short requests per distribution, idle "
        f"and with {m['clients'] - 1} long generations running, in {BLOCKS} alternating blocks.", "",
        "| mode | TTFT idle p99 ms | TTFT busy p99 ms | busy / idle |", "|---|---|---|---|", *ttft, "",
    ]
