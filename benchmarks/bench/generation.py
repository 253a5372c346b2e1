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
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.bench import generation_report as report_of
from benchmarks.bench.generation_features import served_features
from benchmarks.bench.generation_inprocess import inprocess
from benchmarks.bench.generation_load import PLAIN, log, probes, serving, settings_for, throughput, ttft_blocks, ttft_figures
from benchmarks.bench.generation_report import TWO_WORKERS
from benchmarks.load import cli, stats
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.generation import GenerationResult, generate
from build.catalogue import Catalogue
from serving.launcher import TorchServe
from serving.repo import CATALOGUE, shown
from serving.ts_config import ModelSettings

MODES = ("step", "async")
THREADS = (1, 2)  # one worker's intra-op threads, each mode at each
MESSAGES = [{"role": "system", "content": "You answer about Python."},
            {"role": "user", "content": "What does the for statement do?"}]


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
