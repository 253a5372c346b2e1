"""Benchmark a causal-LM (generating) model: in-process KV cache vs recomputation, then a real
TorchServe with continuous batching against the same archive at batchSize 1, and time to first
token for a short request on an idle server against one busy with long generations. One run,
one report.

    python -m benchmarks.bench.generation --model tinylm
    make bench MODEL=tinylm            (the bench's entry point sends generating families here)

Writes benchmarks/reports/generation-<model>-<time>/ (report.json, report.md, ttft.png, tokens.png).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench import generation_features as features
from benchmarks.bench import generation_modes as modes
from benchmarks.bench import generation_openai
from benchmarks.bench.generation_modes import settings_for
from benchmarks.bench.generation_probes import PROMPTS, log, probes, throughput, ttft_figures
from benchmarks.bench.inprocess import extracted_archive
from benchmarks.load import stats
from benchmarks.load.generation import Generators
from serving.errors import BenchmarkError
from serving.fake_context import FakeContext
from serving.launcher import TorchServe
from serving.repo import MODEL_STORE, REPORTS, shown

# The KV cache and continuous batching compared alone: speculation and the prefix cache have their own rows.
PLAIN = {"speculation": "off", "prefix_cache_mib": 0}


# ---- in-process ----------------------------------------------------------------------------------
def inprocess(model: str, new_tokens: int, repeats: int, clients: int) -> dict:
    """KV cache vs recomputing every step, one sequence, `new_tokens` tokens (ignore_eos), same handler."""
    from handlers.handler import Handler

    with tempfile.TemporaryDirectory(prefix="genbench-") as tmp:
        model_dir = extracted_archive(model, None, Path(tmp))
        handler = Handler()
        # The KV cache and batching alone: speculation and the prefix cache have their own sections.
        handler.initialize(FakeContext(model_dir, model, batch_size=8, handler_overrides={"causal_lm": PLAIN}))
        engine, family = handler.generation.engine, handler.family
        request = family.decode({"prompt": PROMPTS[0], "max_new_tokens": new_tokens, "ignore_eos": True}, "")
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
        speculation = features.inprocess_speculation(handler, model_dir, new_tokens, repeats)
    kv, recompute = statistics.median(rates["kv_cache"]), statistics.median(rates["recompute"])
    return {"new_tokens": new_tokens, "threads": threads, "repeats": repeats,
            "kv_cache_tokens_per_s": [round(x, 1) for x in rates["kv_cache"]],
            "recompute_tokens_per_s": [round(x, 1) for x in rates["recompute"]],
            "speedup": round(kv / recompute, 2), "speedup_min": round(min(rates["kv_cache"]) / max(rates["recompute"]), 2),
            "same_tokens": same, "batched_tokens_per_s": batch, "batch_size": clients, "batch_by_threads": by_threads,
            "speculation": speculation}


SECOND_THREAD = "2, second thread"


def batch_requests(family, size: int, new_tokens: int) -> list:
    return [(f"b{i}", family.decode({"prompt": PROMPTS[i % len(PROMPTS)], "max_new_tokens": new_tokens,
                                     "ignore_eos": True}, "")) for i in range(size)]


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


# ---- served --------------------------------------------------------------------------------------
def ttft_experiment(server: TorchServe, model: str, args) -> dict:
    """Short requests on the idle server and with clients-1 long generations running, in alternating
    blocks (so a slow spell of a shared machine falls on both), --probes of each in all."""
    blocks = 4
    idle, busy, background = [], [], 0
    # Not streamed: the server runs them the same, and 7 client threads parsing ~900 chunks/s
    # would compete with the probe for this process's interpreter and skew its timing.
    long_body = {"prompt": PROMPTS[1], "max_new_tokens": args.long_tokens, "ignore_eos": True}
    for block in range(blocks):
        log(f"  time to first token, block {block + 1}/{blocks}: idle, then {args.clients - 1} long generations running")
        idle.extend(probes(server, model, args.probes // blocks))
        with Generators(server.client, model, args.clients - 1, lambda c, i: long_body, stream=False) as load:
            time.sleep(1.0)  # the long ones are all in the batch
            busy.extend(probes(server, model, args.probes // blocks))
            background += len(load.stop())
    out = {"ttft_idle": ttft_figures(idle), "ttft_busy": ttft_figures(busy)}
    out["ttft_busy"]["background_requests"] = background
    log(f"  TTFT idle {stats.tail_text(out['ttft_idle'], 2)}, busy {stats.tail_text(out['ttft_busy'], 2)}")
    return out


def served(model: str, args) -> dict:
    """One sequence at a time against continuous batching, same archive and load, in `args.mode`:
    step mode's batchSize 1 against batchSize = clients; the async mode's max_running 1 (the
    worker runs one sequence, the others wait) against no cap."""
    out = {"mode": args.mode, "threads": args.threads}
    with tempfile.TemporaryDirectory(prefix="genbench-plain-") as tmp:
        for label, one in (("batch_size_1", True), ("continuous", False)):
            store = Path(tmp) / label
            cap = {"max_running": 1 if one else 0} if args.mode == "async" else {}
            features.with_settings(MODEL_STORE / f"{model}.mar", store, model, {**PLAIN, "mode": args.mode, **cap})
            settings = settings_for(args.mode, 1 if one else args.clients, threads=args.threads)
            how = f"max_running {cap['max_running']}" if cap else f"batchSize {settings.batch_size}"
            log(f"served, {label}: {args.mode} mode, 1 worker x {args.threads} thread(s), {how}")
            with TorchServe(store, models={model: settings}, load=(model,)) as server:
                probes(server, model, 3)  # warm the path
                out[label] = throughput(server, model, args.clients, args.new_tokens, args.rounds)
                log(f"  {args.clients} clients x {args.rounds} x {args.new_tokens} tokens: "
                    f"{out[label]['tokens_per_s']} tokens/s")
                if not one:
                    out.update(ttft_experiment(server, model, args))
    out["continuous_over_batch_1"] = round(out["continuous"]["tokens_per_s"] / out["batch_size_1"]["tokens_per_s"], 2)
    out["ttft_busy_over_idle_p99"] = round(out["ttft_busy"]["p99_ms"] / out["ttft_idle"]["p99_ms"], 2)
    return out


# ---- report --------------------------------------------------------------------------------------
def _inter_chunk(figures: dict) -> dict:
    """A throughput run's inter-chunk gaps as stats.tail_text reads them (None: not recorded)."""
    return {"count": figures.get("inter_chunk_count"), "p90_ms": figures.get("inter_chunk_p90_ms"),
            "p99_ms": figures["inter_chunk_p99_ms"]}


def _bold_ratio(text: str) -> str:
    """"p90 (n=..): 1.05x" -> "p90 (n=..): **1.05x**"."""
    name, _, value = text.rpartition(": ")
    return f"{name}: **{value}**"


def markdown(report: dict) -> str:
    ip, sv = report["inprocess"], report["served"]
    return "\n".join([
        f"# Generation benchmark: {report['model']} ({report['when']})",
        "",
        f"Command: `{report['command']}`",
        "",
        "## In-process: KV cache vs recomputation",
        f"One sequence, {ip['new_tokens']} new tokens, {ip['threads']} thread(s), {ip['repeats']} repeats, same tokens: "
        f"{ip['same_tokens']}.",
        "",
        "| path | tokens/s (each repeat) |",
        "|---|---|",
        f"| KV cache | {', '.join(map(str, ip['kv_cache_tokens_per_s']))} |",
        f"| recompute | {', '.join(map(str, ip['recompute_tokens_per_s']))} |",
        "",
        f"Speed-up (medians): **{ip['speedup']}x** (slowest KV repeat over fastest recompute: {ip['speedup_min']}x). "
        f"Batched in-process: {ip['batched_tokens_per_s']} tokens/s at 1 / 8 sequences.",
        *by_threads_lines(ip),
        "",
        f"## Served: continuous batching vs one sequence at a time (same archive, {sv.get('mode', 'step')} mode, "
        f"1 worker x {sv.get('threads', 'the plan')} thread(s))",
        "",
        "One at a time: " + ("max_running 1 (the worker runs one sequence, the others wait in it)."
                             if sv.get("mode") == "async" else "batchSize 1."),
        "",
        "| server | clients | requests | tokens/s | TTFT p50 ms | inter-chunk p99 ms |",
        "|---|---|---|---|---|---|",
        *[f"| {k} | {sv[k]['clients']} | {sv[k]['requests']} | {sv[k]['tokens_per_s']} | {sv[k]['ttft_p50_ms']} | "
          f"{stats.tail_cell(_inter_chunk(sv[k]), 2)} |" for k in ("batch_size_1", "continuous")],
        "",
        f"Continuous batching over one sequence at a time: **{sv['continuous_over_batch_1']}x** tokens/s.",
        "",
        "## Time to first token: a short request, idle vs 7 long generations running",
        "",
        "| server | probes | p50 ms | p90 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|",
        *[f"| {k} | {sv[k]['count']} | {sv[k]['p50_ms']} | {sv[k]['p90_ms']} | {stats.tail_cell(sv[k], 2)} | "
          f"{sv[k]['max_ms']} |" for k in ("ttft_idle", "ttft_busy")],
        "",
        f"Busy over idle, {_bold_ratio(stats.tail_ratio(sv['ttft_busy'], sv['ttft_idle']))}.",
        "",
        "![TTFT](ttft.png)",
        "![tokens/s](tokens.png)",
        "",
        *modes.markdown(report),
        *generation_openai.markdown(report),
        *features.markdown(report),
    ])


def by_threads_lines(ip: dict) -> list[str]:
    rows = ip.get("batch_by_threads")
    if not rows:
        return []
    labels = {"1": "1 thread", "2": "2 threads", SECOND_THREAD: "2 threads from a second Python thread"}
    return ["", f"The engine at {ip['batch_size']} sequences (tokens/s, median of {ip['repeats']}): "
            + "; ".join(f"{labels[k]} **{v}**" for k, v in rows.items()) + "."]


def plots(report: dict, folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sv, ip = report["served"], report["inprocess"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("ttft_idle", "idle server"), ("ttft_busy", f"{report['clients'] - 1} long generations running")):
        values = sv[key]["values_ms"]
        ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label)
    ax.set_xlabel("time to first token, ms")
    ax.set_ylabel("fraction of short requests")
    ax.set_title(f"{report['model']}: time to first token (CDF)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "ttft.png", dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    axes[0].bar(["recompute", "KV cache"], [statistics.median(ip["recompute_tokens_per_s"]),
                                            statistics.median(ip["kv_cache_tokens_per_s"])], color=["grey", "tab:blue"])
    axes[0].set_title(f"in-process, 1 sequence, {ip['new_tokens']} tokens")
    axes[0].set_ylabel("tokens/s")
    axes[1].bar(["one at a time", "continuous batching"], [sv["batch_size_1"]["tokens_per_s"],
                                                         sv["continuous"]["tokens_per_s"]], color=["grey", "tab:blue"])
    axes[1].set_title(f"served, {report['clients']} clients x {report['new_tokens']} tokens")
    fig.tight_layout()
    fig.savefig(folder / "tokens.png", dpi=110)
    plt.close(fig)


def add_arguments(parser) -> None:
    features.add_arguments(parser)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench.generation", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tinylm")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (= the batch's sequences)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per request in the throughput runs")
    parser.add_argument("--rounds", type=int, default=6, help="requests per client in the throughput runs")
    parser.add_argument("--parts", type=lambda t: set(t.split(",")), default={"modes", "openai", "features"},
                        help="what to run after the in-process and step-mode rows: modes (async against step, "
                             "the async mode's workers), openai (first token through OpenAI's client against "
                             "/predictions), features (speculation, prefix cache, priorities); default all")
    parser.add_argument("--openai-pairs", type=int, default=1000, help="requests of each kind in the openai part")
    parser.add_argument("--openai-tokens", type=int, default=64)
    parser.add_argument("--probes", type=int, default=2000,
                        help="short requests per TTFT distribution (a report prints a p99 over fewer than "
                             "1,000 as the p90 and the count)")
    parser.add_argument("--long-tokens", type=int, default=256, help="tokens of the background generations")
    parser.add_argument("--inprocess-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5, help="in-process repeats of each path")
    parser.add_argument("--out", type=Path, default=REPORTS)
    add_arguments(parser)
    args = parser.parse_args(argv)
    when = time.strftime("%Y%m%d-%H%M%S")
    log(f"in-process: KV cache vs recompute, {args.inprocess_tokens} tokens")
    report = {"model": args.model, "when": when, "clients": args.clients, "new_tokens": args.new_tokens,
              "command": "python -m benchmarks.bench.generation " + " ".join(argv if argv is not None else sys.argv[1:]),
              "inprocess": inprocess(args.model, args.inprocess_tokens, args.repeats, args.clients)}
    try:
        report["served"] = served(args.model, args)
        if "modes" in args.parts:
            report["modes_compared"] = modes.compare(args.model, args, report["inprocess"]["batch_by_threads"])
        if "openai" in args.parts:
            log(f"OpenAI's client against /predictions: {args.openai_pairs} pairs")
            report["openai_compared"] = generation_openai.compare(args.model, args.openai_tokens, args.openai_pairs)
        if "features" in args.parts:
            report["further"] = features.served(args.model, args)
    except BenchmarkError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    folder = args.out / f"generation-{args.model}-{when}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "report.md").write_text(markdown(report))
    plots(report, folder)
    features.plots(report, folder)
    log(f"report: {shown(folder / 'report.md')}")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
