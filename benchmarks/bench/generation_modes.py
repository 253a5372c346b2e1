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


# The async mode's worker layouts on two cores: the tuner may choose any of them.
LAYOUTS = (("1 worker x 1 thread", 1, 1), ("1 worker x 2 threads", 1, 2), ("2 workers x 1 thread", 2, 1))


def compare(model: str, args, engine_by_threads: dict) -> dict:
    """Both modes on one worker (the plan's threads), then the async mode's worker layouts; ratios
    measured in this run. `engine_by_threads`: the in-process engine's tokens/s at the same batch,
    by intra-op threads."""
    out = {"modes": {}, "clients": args.clients, "probes": args.probes}
    with tempfile.TemporaryDirectory(prefix="genbench-modes-") as tmp:
        for mode in MODES:
            store = Path(tmp) / mode
            with_handler_settings(MODEL_STORE / f"{model}.mar", store, model, {"causal_lm": {**PLAIN, "mode": mode}})
            log(f"mode {mode}: 1 worker, {args.clients} streaming clients x {args.rounds} x {args.new_tokens} tokens")
            with TorchServe(store, models={model: settings_for(mode, args.clients)}, load=(model,)) as server:
                probes(server, model, 3)  # warm the path
                figures = throughput(server, model, args.clients, args.new_tokens, args.rounds)
                figures["threads"] = server_threads(server, model)
                log(f"  {figures['tokens_per_s']} tokens/s ({figures['threads']} thread(s))")
                figures.update(ttft_blocks(server, model, args.clients, args.probes, args.long_tokens))
                log(f"  TTFT idle {stats.tail_text(figures['ttft_idle'])}, busy {stats.tail_text(figures['ttft_busy'])}")
            figures["step_ms"] = round(1000 * args.clients / figures["tokens_per_s"], 2)
            engine = engine_by_threads.get(str(figures["threads"]))
            figures["over_inprocess"] = round(figures["tokens_per_s"] / engine, 2) if engine else None
            out["modes"][mode] = figures
        for label, workers, threads in LAYOUTS:
            log(f"async, {label}: {args.clients} clients")
            with TorchServe(Path(tmp) / "async", models={model: settings_for("async", args.clients, workers, threads)},
                            load=(model,)) as server:
                probes(server, model, 3)
                figures = throughput(server, model, args.clients, args.new_tokens, args.rounds)
            engine = engine_by_threads.get(str(threads)) if workers == 1 else None
            figures["over_inprocess"] = round(figures["tokens_per_s"] / engine, 2) if engine else None
            out.setdefault("workers", {})[label] = figures
            log(f"  {figures['tokens_per_s']} tokens/s")
    out["engine_by_threads"] = engine_by_threads
    step, asyn = out["modes"]["step"], out["modes"]["async"]
    out["async_over_step"] = round(asyn["tokens_per_s"] / step["tokens_per_s"], 2)
    for figures in out["modes"].values():
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
    rows = [f"| {mode} | {f['threads']} | {f['tokens_per_s']} | {f['step_ms']} | {f['over_inprocess']}x | "
            f"{stats.tail_cell(f['ttft_idle'])} | {stats.tail_cell(f['ttft_busy'])} | {f['ttft_busy_over_idle']} |"
            for mode, f in m["modes"].items()]
    layouts = [f"| {label} | {f['tokens_per_s']} | {'' if f['over_inprocess'] is None else str(f['over_inprocess']) + 'x'} |"
               for label, f in m.get("workers", {}).items()]
    engine = m["engine_by_threads"]
    return [
        "## Asynchronous worker mode against the step-per-call mode (same archive, same load)", "",
        f"{m['clients']} streaming clients; TTFT: {m['probes']} short requests per distribution, idle and with "
        f"{m['clients'] - 1} long generations running, in {BLOCKS} alternating blocks. One worker with the plan's "
        f"threads. The in-process engine at {m['clients']} sequences: "
        + ", ".join(f"{v} tokens/s ({k} thread(s))" for k, v in engine.items()) + ".", "",
        "| mode | threads | tokens/s | ms per step (served) | / in-process, same threads | TTFT idle p99 ms | "
        "TTFT busy p99 ms | busy / idle |",
        "|---|---|---|---|---|---|---|---|", *rows, "",
        f"Async over step: **{m['async_over_step']}x** tokens/s.", "",
        "| async, workers | tokens/s | / in-process, same threads |", "|---|---|---|", *layouts, "",
    ]
