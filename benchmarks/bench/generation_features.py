"""The generation benchmark's engine features, in the same report as generation.py's:
speculative decoding off / with the draft model / by prompt lookup (in-process, one sequence; then
served, at 1, 2 and 8 concurrent sequences), the prefix cache (time to first token for a 1,000-token
shared prefix, hit vs miss) and priorities (time to first token per class with the server saturated
by low-priority long generations). Each served part runs a copy of the archive with its
`causal_lm` settings changed (the archive itself is untouched).
"""

from __future__ import annotations

import statistics
import tempfile
import time
import zipfile
from pathlib import Path

from benchmarks.bench.archive_settings import with_handler_settings
from benchmarks.bench.generation_modes import MODES as GENERATION_MODES
from benchmarks.bench.generation_modes import settings_for
from benchmarks.bench.generation_probes import PROMPTS, log, probes, throughput, ttft_figures
from benchmarks.load import stats
from benchmarks.load.generation import Generators, generate
from serving.errors import BenchmarkError
from serving.launcher import TorchServe
from serving.repo import MODEL_STORE

SPECULATION = ("off", "draft", "lookup")
PRIORITY_PROBES = 50  # per class and block


def with_settings(src: Path, store: Path, name: str, causal_lm: dict) -> None:
    """`store/<name>.mar`: the archive with these causal_lm settings changed."""
    with_handler_settings(src, store, name, {"causal_lm": causal_lm})


def repeated_paragraph_prompt() -> str:
    from pydoc_data.topics import topics

    paragraph = topics["if"][:600]
    return paragraph + "\n\nAgain:\n\n" + paragraph[:80]


# ---- in-process ---------------------------------------------------------------------------------
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


# ---- served -------------------------------------------------------------------------------------
def served_speculation(model: str, tmp: Path, new_tokens: int, mode: str, threads: int) -> dict:
    """Tokens/s at 1, 2 and 8 closed-loop clients for each speculation setting (`mode`: how
    TorchServe drives the engine)."""
    out = {}
    for speculation in SPECULATION:
        store = tmp / f"spec-{speculation}"
        with_settings(MODEL_STORE / f"{model}.mar", store, model,
                      {"speculation": speculation, "prefix_cache_mib": 0, "mode": mode})
        log(f"served speculation {speculation}: TorchServe, {mode} mode")
        with TorchServe(store, models={model: settings_for(mode, 8, threads=threads)}, load=(model,)) as server:
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
    store = tmp / "prefix"
    with_settings(MODEL_STORE / f"{model}.mar", store, model,
                  {"speculation": "off", "prefix_cache_mib": 64, "mode": mode})
    log(f"prefix cache: {count} hits and {count} misses, alternating, {prefix_tokens}-token prefixes")
    hits, misses = [], []
    with TorchServe(store, models={model: settings_for(mode, 8, threads=threads)}, load=(model,)) as server:
        probes(server, model, 3)
        body = {"prompt": shared, "max_new_tokens": 8}
        first = generate(server.client, model, body)  # a miss: the prefix is now cached
        for i in range(count):
            for prompt, into in ((shared, hits), (others[i], misses)):
                result = generate(server.client, model, {**body, "prompt": prompt})
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
    store = tmp / "priority"
    with_settings(MODEL_STORE / f"{model}.mar", store, model,
                  {"max_running": max_running, "prefix_cache_mib": 0, "mode": mode})
    batch = 2 * load_clients  # the frontend hands over every request in flight: none waits in its FIFO queue
    high, low = {"X-Priority": "high"}, {"X-Priority": "low"}
    long_body = {"prompt": PROMPTS[1], "max_new_tokens": long_tokens, "ignore_eos": True}
    idle, busy, busy_low, background = [], [], [], []
    blocks = 4
    with TorchServe(store, models={model: settings_for(mode, batch, threads=threads)}, load=(model,)) as server:
        probes(server, model, 3)

        def probe(headers, count):
            out = []
            for i in range(count):
                result = generate(server.client, model, {"prompt": PROMPTS[i % len(PROMPTS)], "max_new_tokens": 4},
                                  headers=headers)
                if not result.ok:
                    raise BenchmarkError(f"priority probe failed: {result.status} {result.error}")
                out.append(result)
            return out

        for block in range(blocks):
            log(f"priorities, block {block + 1}/{blocks}: idle, then {load_clients} low-priority long generations "
                f"({max_running} run at once)")
            idle.extend(probe(high, PRIORITY_PROBES))
            started = time.perf_counter()
            with Generators(server.client, model, load_clients, lambda c, i: long_body, stream=False,
                            headers=low) as load:
                time.sleep(1.0)
                busy.extend(probe(high, PRIORITY_PROBES))
                busy_low.extend(probe(low, PRIORITY_PROBES // 5))
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


def served(model: str, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="genbench-stores-") as tmp:
        return {"mode": args.mode, "threads": args.threads,
                "speculation": served_speculation(model, Path(tmp), args.spec_tokens, args.mode, args.threads),
                "prefix": prefix_experiment(model, Path(tmp), args.prefix_probes, args.prefix_tokens, args.mode,
                                            args.threads),
                "priority": priority_experiment(model, Path(tmp), args.low_clients, args.max_running, args.long_tokens,
                                                args.mode, args.threads)}


def add_arguments(parser) -> None:
    parser.add_argument("--mode", choices=GENERATION_MODES, default="async",
                        help="how TorchServe drives the engine in the served runs (the modes part serves both)")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of the one worker in the served runs (default 1: on two cores the "
                             "layout that serves the most, leaving a core to the frontend and the clients; the "
                             "modes part measures 1 and 2)")
    parser.add_argument("--spec-tokens", type=int, default=128, help="tokens per request, served speculation")
    parser.add_argument("--prefix-probes", type=int, default=200,
                        help="hit / miss pairs (reports print a p99 over fewer than 1,000 as the p90 and n)")
    parser.add_argument("--prefix-tokens", type=int, default=1000)
    parser.add_argument("--low-clients", type=int, default=8, help="low-priority long generations at once")
    parser.add_argument("--max-running", type=int, default=4, help="causal_lm.max_running in the priority run")


# ---- report -------------------------------------------------------------------------------------
def markdown(report: dict) -> list[str]:
    if "further" not in report:
        return []
    spec, sv = report["inprocess"]["speculation"], report["further"]
    served_spec, prefix, prio = sv["speculation"], sv["prefix"], sv["priority"]
    return [
        "## Speculative decoding, in-process (greedy, one sequence, tokens/s each repeat)",
        "",
        "| prompt | prompt tokens | off | draft model | lookup | draft speed-up | draft acceptance | lookup speed-up "
        "| lookup acceptance | same tokens |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *[f"| {k} | {v['prompt_tokens']} | {', '.join(map(str, v['off_tokens_per_s']))} | "
          f"{', '.join(map(str, v['draft_tokens_per_s']))} | {', '.join(map(str, v['lookup_tokens_per_s']))} | "
          f"**{v['draft_speedup']}x** | {v['draft_acceptance']} | **{v['lookup_speedup']}x** | {v['lookup_acceptance']} "
          f"| {v['same_tokens']} |" for k, v in spec.items()],
        "",
        "Speed-ups are ratios of medians. Acceptance: drafted tokens kept / drafted (last repeat).",
        "",
        f"## Speculative decoding, served ({sv.get('mode', 'step')} mode, 1 worker x {sv.get('threads', 'the plan')} "
        "thread(s), tokens/s)",
        "",
        "| speculation | 1 client | 2 clients | 8 clients |",
        "|---|---|---|---|",
        *[f"| {mode} | {served_spec[mode]['1']} | {served_spec[mode]['2']} | {served_spec[mode]['8']} |" for mode in SPECULATION],
        *[f"| {mode} / off | {r['1']}x | {r['2']}x | {r['8']}x |" for mode, r in served_spec["ratios"].items()],
        "",
        "The engine speculates only while the batch holds at most `speculate_max_batch` (2) sequences.",
        "",
        f"## Prefix cache: time to first token, {prefix['prefix_tokens']}-token shared prefix + a short question",
        "",
        "| | probes | p50 ms | p90 ms | p99 ms |",
        "|---|---|---|---|---|",
        *[f"| {k} | {prefix[k]['count']} | {prefix[k]['p50_ms']} | {prefix[k]['p90_ms']} | "
          f"{stats.tail_cell(prefix[k], 2)} |" for k in ("hit", "miss")],
        "",
        f"Miss over hit: **{prefix['miss_over_hit_p50']}x** at p50, {stats.tail_ratio(prefix['miss'], prefix['hit'])} "
        f"({prefix['prompt_tokens']} prompt tokens). Every hit's answer equals the first (miss) answer: "
        f"{prefix['hit_answers_equal_the_miss']}.",
        "",
        f"## Priorities: {prio['load_clients']} low-priority long generations, max_running {prio['max_running']}, "
        f"batchSize {prio['batch_size']}",
        "",
        "| probes | count | p50 ms | p90 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|",
        *[f"| {label} | {prio[k]['count']} | {prio[k]['p50_ms']} | {prio[k]['p90_ms']} | "
          f"{stats.tail_cell(prio[k], 2)} | {prio[k]['max_ms']} |"
          for k, label in (("high_idle", "high, idle server"), ("high_busy", "high, saturated"),
                           ("low_busy", "low, saturated"))],
        "",
        f"High-priority TTFT saturated over idle, **{stats.tail_ratio(prio['high_busy'], prio['high_idle'])}**. "
        f"Low-priority long generations completed meanwhile: {prio['low_long_completed']} "
        f"({prio['low_long_tokens_per_s']} tokens/s).",
        "",
        "![speculation](speculation.png)",
        "![prefix and priorities](ttft_classes.png)",
        "",
    ]


def plots(report: dict, folder: Path) -> None:
    if "further" not in report:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sv = report["further"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    spec = report["inprocess"]["speculation"]
    width = 0.25
    for i, mode in enumerate(SPECULATION):
        axes[0].bar([j + i * width for j in range(len(spec))],
                    [statistics.median(v[f"{mode}_tokens_per_s"]) for v in spec.values()], width, label=mode)
        axes[1].bar([j + i * width for j in range(3)], [sv["speculation"][mode][c] for c in ("1", "2", "8")], width,
                    label=mode)
    axes[0].set_xticks([j + width for j in range(len(spec))], list(spec))
    axes[0].set_title("in-process, one sequence")
    axes[0].set_ylabel("tokens/s")
    axes[1].set_xticks([j + width for j in range(3)], ["1 client", "2 clients", "8 clients"])
    axes[1].set_title("served, continuous batching")
    axes[1].legend(title="speculation")
    fig.tight_layout()
    fig.savefig(folder / "speculation.png", dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, series, title in (
            (axes[0], (("hit", sv["prefix"]["hit"]), ("miss", sv["prefix"]["miss"])), "prefix cache"),
            (axes[1], (("high, idle", sv["priority"]["high_idle"]), ("high, saturated", sv["priority"]["high_busy"]),
                       ("low, saturated", sv["priority"]["low_busy"])), "priorities")):
        for label, figures in series:
            values = figures["values_ms"]
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label)
        ax.set_xscale("log")
        ax.set_xlabel("time to first token, ms (log)")
        ax.set_title(title)
        ax.legend()
    axes[0].set_ylabel("fraction of requests")
    fig.tight_layout()
    fig.savefig(folder / "ttft_classes.png", dpi=110)
    plt.close(fig)
