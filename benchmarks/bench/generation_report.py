"""The generation benchmark's report: report.md's sections and the plots, from report.json's content."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.load import stats
from benchmarks.load.cli import figure, table

SPECULATION = ("off", "draft", "lookup")
SECOND_THREAD = "2, second thread"
TWO_WORKERS = "2 workers x 1 thread"  # the async mode's other layout on two cores
BLOCKS = 4  # TTFT probes: idle and busy in this many alternating blocks


def _inter_chunk(figures: dict) -> dict:
    """A throughput run's inter-chunk gaps as stats.tail_text reads them (None: not recorded)."""
    return {"count": figures.get("inter_chunk_count"), "p90_ms": figures.get("inter_chunk_p90_ms"),
            "p99_ms": figures["inter_chunk_p99_ms"]}


def _bold_ratio(text: str) -> str:
    """"p90 (n=..): 1.05x" -> "p90 (n=..): **1.05x**"."""
    name, _, value = text.rpartition(": ")
    return f"{name}: **{value}**"


def _joined(values) -> str:
    return ", ".join(map(str, values))


def markdown(report: dict) -> str:
    ip, sv = report["inprocess"], report["served"]
    return "\n".join([
        f"# Generation benchmark: {report['model']} ({report['when']})", "",
        f"Command: `{report['command']}`", "",
        "## In-process: KV cache vs recomputation",
        f"One sequence, {ip['new_tokens']} new tokens, {ip['threads']} thread(s), {ip['repeats']} repeats, same tokens: "
        f"{ip['same_tokens']}.", "",
        *table(("path", "tokens/s (each repeat)"), [("KV cache", _joined(ip["kv_cache_tokens_per_s"])),
                                                     ("recompute", _joined(ip["recompute_tokens_per_s"]))]), "",
        f"Speed-up (medians): **{ip['speedup']}x** (slowest KV repeat over fastest recompute: {ip['speedup_min']}x). "
        f"Batched in-process: {ip['batched_tokens_per_s']} tokens/s at 1 / 8 sequences.",
        *by_threads_lines(ip), "",
        f"## Served: continuous batching vs one sequence at a time (same archive, {sv.get('mode', 'step')} mode, "
        f"1 worker x {sv.get('threads', 'the plan')} thread(s))", "",
        "One at a time: " + ("max_running 1 (the worker runs one sequence, the others wait in it)."
                             if sv.get("mode") == "async" else "batchSize 1."), "",
        *table(("server", "clients", "requests", "tokens/s", "TTFT p50 ms", "inter-chunk p99 ms"),
               [(k, sv[k]["clients"], sv[k]["requests"], sv[k]["tokens_per_s"], sv[k]["ttft_p50_ms"],
                 stats.tail_cell(_inter_chunk(sv[k]), 2)) for k in ("batch_size_1", "continuous")]), "",
        f"Continuous batching over one sequence at a time: **{sv['continuous_over_batch_1']}x** tokens/s.", "",
        "## Time to first token: a short request, idle vs 7 long generations running", "",
        *table(("server", "probes", "p50 ms", "p90 ms", "p99 ms", "max ms"),
               [(k, sv[k]["count"], sv[k]["p50_ms"], sv[k]["p90_ms"], stats.tail_cell(sv[k], 2), sv[k]["max_ms"])
                for k in ("ttft_idle", "ttft_busy")]), "",
        f"Busy over idle, {_bold_ratio(stats.tail_ratio(sv['ttft_busy'], sv['ttft_idle']))}.", "",
        "![TTFT](ttft.png)", "![tokens/s](tokens.png)", "",
        *modes_lines(report), *openai_lines(report), *features_lines(report),
    ])


def by_threads_lines(ip: dict) -> list[str]:
    rows = ip.get("batch_by_threads")
    if not rows:
        return []
    labels = {"1": "1 thread", "2": "2 threads", SECOND_THREAD: "2 threads from a second Python thread"}
    return ["", f"The engine at {ip['batch_size']} sequences (tokens/s, median of {ip['repeats']}): "
            + "; ".join(f"{labels[k]} **{v}**" for k, v in rows.items()) + "."]


def modes_lines(report: dict) -> list[str]:
    m = report.get("modes_compared")
    if not m:
        return []
    engine = m["engine_by_threads"]
    ratios = ", ".join(f"{r}x at {t} thread(s)" for t, r in m["async_over_step"].items())
    return [
        "## Asynchronous worker mode against the step-per-call mode (same archive, same load)", "",
        f"{m['clients']} streaming clients on one worker. The in-process engine at {m['clients']} sequences (tokens/s): "
        + ", ".join(f"{v} ({k if ',' in k else k + ' thread(s)'})" for k, v in engine.items()) + ".", "",
        *table(("mode", "threads", "tokens/s", "ms per step (served)", "/ in-process, same threads"),
               [(mode, t, f["tokens_per_s"], f["step_ms"], f"{f['over_inprocess']}x")
                for mode, runs in m["modes"].items() for t, f in runs.items()]), "",
        f"Async over step: {ratios}; each mode at its best: **{m['best_over_best']}x**. Async on "
        f"{TWO_WORKERS}: {m['two_workers']['tokens_per_s']} tokens/s.", "",
        f"Time to first token at {m['ttft_threads']} thread(s): {m['probes']} short requests per distribution, idle "
        f"and with {m['clients'] - 1} long generations running, in {BLOCKS} alternating blocks.", "",
        *table(("mode", "TTFT idle p99 ms", "TTFT busy p99 ms", "busy / idle"),
               [(mode, stats.tail_cell(f["ttft_idle"]), stats.tail_cell(f["ttft_busy"]), f["ttft_busy_over_idle"])
                for mode, runs in m["modes"].items() for f in runs.values() if "ttft_idle" in f]), "",
    ]


def openai_lines(report: dict) -> list[str]:
    o = report.get("openai_compared")
    if not o:
        return []
    return [
        "## First token through OpenAI's client against /predictions (async mode, same request)", "",
        f"{o['pairs']} pairs, one request at a time, alternating; {o['tokens']} tokens each, greedy.", "",
        *table(("path", "requests", "p50 ms", "p90 ms", "p99 ms"),
               [(label, o[k]["count"], o[k]["p50_ms"], o[k]["p90_ms"], stats.tail_cell(o[k]))
                for label, k in (("OpenAI client, streamed chat", "openai_chat"),
                                 ("/predictions, first NDJSON line", "predictions_ndjson"))]), "",
        f"OpenAI over /predictions: p50 **{o['p50_ratio']}x**, {o['tail_ratio']}.", "",
    ]


def features_lines(report: dict) -> list[str]:
    if "further" not in report:
        return []
    spec, sv = report["inprocess"]["speculation"], report["further"]
    served_spec, prefix, prio = sv["speculation"], sv["prefix"], sv["priority"]
    return [
        "## Speculative decoding, in-process (greedy, one sequence, tokens/s each repeat)", "",
        *table(("prompt", "prompt tokens", "off", "draft model", "lookup", "draft speed-up", "draft acceptance",
                "lookup speed-up", "lookup acceptance", "same tokens"),
               [(k, v["prompt_tokens"], _joined(v["off_tokens_per_s"]), _joined(v["draft_tokens_per_s"]),
                 _joined(v["lookup_tokens_per_s"]), f"**{v['draft_speedup']}x**", v["draft_acceptance"],
                 f"**{v['lookup_speedup']}x**", v["lookup_acceptance"], v["same_tokens"]) for k, v in spec.items()]), "",
        "Speed-ups are ratios of medians. Acceptance: drafted tokens kept / drafted (last repeat).", "",
        f"## Speculative decoding, served ({sv.get('mode', 'step')} mode, 1 worker x {sv.get('threads', 'the plan')} "
        "thread(s), tokens/s)", "",
        *table(("speculation", "1 client", "2 clients", "8 clients"),
               [(mode, *(served_spec[mode][c] for c in ("1", "2", "8"))) for mode in SPECULATION]
               + [(f"{mode} / off", *(f"{r[c]}x" for c in ("1", "2", "8"))) for mode, r in served_spec["ratios"].items()]),
        "", "The engine speculates only while the batch holds at most `speculate_max_batch` (2) sequences.", "",
        f"## Prefix cache: time to first token, {prefix['prefix_tokens']}-token shared prefix + a short question", "",
        *table(("", "probes", "p50 ms", "p90 ms", "p99 ms"),
               [(k, prefix[k]["count"], prefix[k]["p50_ms"], prefix[k]["p90_ms"], stats.tail_cell(prefix[k], 2))
                for k in ("hit", "miss")]), "",
        f"Miss over hit: **{prefix['miss_over_hit_p50']}x** at p50, {stats.tail_ratio(prefix['miss'], prefix['hit'])} "
        f"({prefix['prompt_tokens']} prompt tokens). Every hit's answer equals the first (miss) answer: "
        f"{prefix['hit_answers_equal_the_miss']}.", "",
        f"## Priorities: {prio['load_clients']} low-priority long generations, max_running {prio['max_running']}, "
        f"batchSize {prio['batch_size']}", "",
        *table(("probes", "count", "p50 ms", "p90 ms", "p99 ms", "max ms"),
               [(label, prio[k]["count"], prio[k]["p50_ms"], prio[k]["p90_ms"], stats.tail_cell(prio[k], 2),
                 prio[k]["max_ms"]) for k, label in (("high_idle", "high, idle server"),
                                                     ("high_busy", "high, saturated"), ("low_busy", "low, saturated"))]),
        "",
        f"High-priority TTFT saturated over idle, **{stats.tail_ratio(prio['high_busy'], prio['high_idle'])}**. "
        f"Low-priority long generations completed meanwhile: {prio['low_long_completed']} "
        f"({prio['low_long_tokens_per_s']} tokens/s).", "",
        "![speculation](speculation.png)", "![prefix and priorities](ttft_classes.png)", "",
    ]


def _cdf(ax, series, title: str, log_x: bool = False) -> None:
    for label, figures in series:
        values = figures["values_ms"]
        ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label)
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel("time to first token, ms" + (" (log)" if log_x else ""))
    ax.set_title(title)
    ax.legend()


def plots(report: dict, folder: Path) -> None:
    sv, ip = report["served"], report["inprocess"]
    with figure(folder / "ttft.png", figsize=(6, 4)) as ax:
        _cdf(ax, (("idle server", sv["ttft_idle"]), (f"{report['clients'] - 1} long generations running", sv["ttft_busy"])),
             f"{report['model']}: time to first token (CDF)")
        ax.set_ylabel("fraction of short requests")
    with figure(folder / "tokens.png", 1, 2, figsize=(9, 3.5)) as axes:
        axes[0].bar(["recompute", "KV cache"], [statistics.median(ip["recompute_tokens_per_s"]),
                                                statistics.median(ip["kv_cache_tokens_per_s"])], color=["grey", "tab:blue"])
        axes[0].set_title(f"in-process, 1 sequence, {ip['new_tokens']} tokens")
        axes[0].set_ylabel("tokens/s")
        axes[1].bar(["one at a time", "continuous batching"], [sv["batch_size_1"]["tokens_per_s"],
                                                             sv["continuous"]["tokens_per_s"]], color=["grey", "tab:blue"])
        axes[1].set_title(f"served, {report['clients']} clients x {report['new_tokens']} tokens")
    if "further" not in report:
        return
    further, spec, width = report["further"], ip["speculation"], 0.25
    with figure(folder / "speculation.png", 1, 2, figsize=(10, 3.8)) as axes:
        for i, mode in enumerate(SPECULATION):
            axes[0].bar([j + i * width for j in range(len(spec))],
                        [statistics.median(v[f"{mode}_tokens_per_s"]) for v in spec.values()], width, label=mode)
            axes[1].bar([j + i * width for j in range(3)], [further["speculation"][mode][c] for c in ("1", "2", "8")],
                        width, label=mode)
        axes[0].set_xticks([j + width for j in range(len(spec))], list(spec))
        axes[0].set_title("in-process, one sequence")
        axes[0].set_ylabel("tokens/s")
        axes[1].set_xticks([j + width for j in range(3)], ["1 client", "2 clients", "8 clients"])
        axes[1].set_title("served, continuous batching")
        axes[1].legend(title="speculation")
    with figure(folder / "ttft_classes.png", 1, 2, figsize=(10, 3.8)) as axes:
        _cdf(axes[0], (("hit", further["prefix"]["hit"]), ("miss", further["prefix"]["miss"])), "prefix cache", True)
        priority = further["priority"]
        _cdf(axes[1], (("high, idle", priority["high_idle"]), ("high, saturated", priority["high_busy"]),
                       ("low, saturated", priority["low_busy"])), "priorities", True)
        axes[0].set_ylabel("fraction of requests")
