"""The generation benchmark's mode comparison: one archive served in TorchServe's asynchronous
worker mode (the engine loop steps at its own speed) against the step-per-call mode (continuous
batching: one frontend round trip per decoding step), the same load on each, in one run.

Per mode: tokens/s of `--clients` streaming clients (and the served time per step at that batch,
next to the in-process engine's), and time to first token of a short request on the idle server
and with clients-1 long generations running, in alternating blocks. Then the async mode's workers:
two workers of one thread against one of two threads.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks.bench.archive_settings import with_handler_settings
from benchmarks.bench.generation_probes import PROMPTS, log, probes, throughput, ttft_figures
from benchmarks.load import stats
from benchmarks.load.generation import Generators
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


def compare(model: str, args, inprocess_tokens_per_s: dict) -> dict:
    """Both modes, then the async mode's worker layouts; ratios measured in this run."""
    out = {"modes": {}, "clients": args.clients, "probes": args.probes}
    with tempfile.TemporaryDirectory(prefix="genbench-modes-") as tmp:
        for mode in MODES:
            store = Path(tmp) / mode
            with_handler_settings(MODEL_STORE / f"{model}.mar", store, model, {"causal_lm": {**PLAIN, "mode": mode}})
            log(f"mode {mode}: 1 worker, {args.clients} streaming clients x {args.rounds} x {args.new_tokens} tokens")
            with TorchServe(store, models={model: settings_for(mode, args.clients)}, load=(model,)) as server:
                probes(server, model, 3)  # warm the path
                figures = throughput(server, model, args.clients, args.new_tokens, args.rounds)
                log(f"  {figures['tokens_per_s']} tokens/s")
                figures.update(ttft_blocks(server, model, args.clients, args.probes, args.long_tokens))
                log(f"  TTFT idle {stats.tail_text(figures['ttft_idle'])}, busy {stats.tail_text(figures['ttft_busy'])}")
            figures["step_ms"] = round(1000 * args.clients / figures["tokens_per_s"], 2)
            out["modes"][mode] = figures
        for label, workers, threads in (("2 workers x 1 thread", 2, 1), ("1 worker x 2 threads", 1, 2)):
            log(f"async, {label}: {args.clients} clients")
            with TorchServe(Path(tmp) / "async", models={model: settings_for("async", args.clients, workers, threads)},
                            load=(model,)) as server:
                probes(server, model, 3)
                out.setdefault("workers", {})[label] = throughput(server, model, args.clients, args.new_tokens,
                                                                  args.rounds)
                log(f"  {out['workers'][label]['tokens_per_s']} tokens/s")
    batch = str(args.clients)
    engine = inprocess_tokens_per_s.get(batch)
    out["inprocess_step_ms"] = round(1000 * args.clients / engine, 2) if engine else None
    step, asyn = out["modes"]["step"], out["modes"]["async"]
    out["async_over_step"] = round(asyn["tokens_per_s"] / step["tokens_per_s"], 2)
    out["async_over_inprocess"] = round(asyn["tokens_per_s"] / engine, 2) if engine else None
    for figures in out["modes"].values():
        figures["ttft_busy_over_idle"] = stats.tail_ratio(figures["ttft_busy"], figures["ttft_idle"])
    return out


def markdown(report: dict) -> list[str]:
    m = report.get("modes_compared")
    if not m:
        return []
    rows = [f"| {mode} | {f['tokens_per_s']} | {f['step_ms']} | {stats.tail_cell(f['ttft_idle'])} | "
            f"{stats.tail_cell(f['ttft_busy'])} | {f['ttft_busy_over_idle']} |" for mode, f in m["modes"].items()]
    workers = [f"| {label} | {f['tokens_per_s']} |" for label, f in m.get("workers", {}).items()]
    return [
        "## Asynchronous worker mode against the step-per-call mode (same archive, same load)", "",
        f"{m['clients']} streaming clients; TTFT: {m['probes']} short requests per distribution, idle and with "
        f"{m['clients'] - 1} long generations running, in {BLOCKS} alternating blocks.", "",
        "| mode | tokens/s | ms per step (served) | TTFT idle p99 ms | TTFT busy p99 ms | busy / idle |",
        "|---|---|---|---|---|---|", *rows, "",
        f"Async over step: **{m['async_over_step']}x** tokens/s. The in-process engine at batch {m['clients']}: "
        f"{m['inprocess_step_ms']} ms per step; the async mode served it at **{m['async_over_inprocess']}x** the "
        "engine's own tokens/s.", "",
        "| async, workers | tokens/s |", "|---|---|", *workers, "",
    ]
