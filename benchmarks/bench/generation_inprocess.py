"""The generation engine in-process, no server: the KV cache against recomputation, the engine by
intra-op threads (and from a second thread, as a worker runs it), and speculative decoding."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench.generation_load import PLAIN, PROMPTS, body, log
from benchmarks.bench.generation_report import SECOND_THREAD, SPECULATION
from benchmarks.bench.inprocess import extracted_archive
from serving.fake_context import FakeContext


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
