"""The generation benchmark's OpenAI part: the first token of a streamed chat answer through
OpenAI's own client against the first NDJSON line of the same request on /predictions.

One async-mode copy of the archive, one server; each pair sends the same chat (the /predictions
side sends the prompt the chat template renders), `--openai-tokens` tokens, greedy, one request at
a time, the two kinds alternating so a slow spell of the machine falls on both. The client is
created once: what is timed is the request, not the client's set-up.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks.bench.archive_settings import with_handler_settings
from benchmarks.bench.generation_probes import log, ttft_figures
from benchmarks.load import stats
from benchmarks.load.generation import GenerationResult, generate
from build.catalogue import Catalogue
from serving.errors import BenchmarkError
from serving.launcher import TorchServe
from serving.repo import CATALOGUE, MODEL_STORE
from serving.ts_config import ModelSettings

MESSAGES = [{"role": "system", "content": "You answer about Python."},
            {"role": "user", "content": "What does the for statement do?"}]
PLAIN = {"speculation": "off", "prefix_cache_mib": 0, "mode": "async"}


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
    done = time.perf_counter()
    return GenerationResult(200, sent, (first,) if first else (), done, text, count, "length")


def compare(model: str, tokens: int, pairs: int) -> dict:
    import openai

    from handlers.openai.chat_template import render

    prompt = render(MESSAGES, None)  # the model has no chat template of its own: the plain one
    with tempfile.TemporaryDirectory(prefix="genbench-openai-") as tmp:
        store = Path(tmp) / "async"
        with_handler_settings(MODEL_STORE / f"{model}.mar", store, model, {"causal_lm": PLAIN})
        with TorchServe(store, models={model: ModelSettings(batch_size=1, max_batch_delay_ms=1)},
                        load=(model,)) as server:
            version = Catalogue.load(CATALOGUE).entry(model).version  # OpenAI's paths come after a version
            client = openai.OpenAI(base_url=f"{server.inference_url}/predictions/{model}/{version}/v1",
                                   api_key=server.tokens.inference, max_retries=0, timeout=120)
            body = {"prompt": prompt, "max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}
            chat, ndjson = [], []
            for i in range(pairs):
                if i % 100 == 0:
                    log(f"  openai vs /predictions: pair {i + 1}-{min(i + 100, pairs)} of {pairs}")
                ndjson.append(generate(server.client, model, body, stream=True))
                chat.append(_openai_first_token(client, model, tokens))
            failed = [r for r in ndjson if not r.ok]
            if failed:
                raise BenchmarkError(f"/predictions request failed: {failed[0].status} {failed[0].error}")
    out = {"tokens": tokens, "pairs": pairs, "openai_chat": ttft_figures(chat), "predictions_ndjson": ttft_figures(ndjson)}
    out["p50_ratio"] = round(out["openai_chat"]["p50_ms"] / out["predictions_ndjson"]["p50_ms"], 2)
    out["tail_ratio"] = stats.tail_ratio(out["openai_chat"], out["predictions_ndjson"])
    return out


def markdown(report: dict) -> list[str]:
    o = report.get("openai_compared")
    if not o:
        return []
    rows = [f"| {label} | {o[key]['count']} | {o[key]['p50_ms']} | {o[key]['p90_ms']} | {stats.tail_cell(o[key])} |"
            for label, key in (("OpenAI client, streamed chat", "openai_chat"),
                               ("/predictions, first NDJSON line", "predictions_ndjson"))]
    return [
        "## First token through OpenAI's client against /predictions (async mode, same request)", "",
        f"{o['pairs']} pairs, one request at a time, alternating; {o['tokens']} tokens each, greedy.", "",
        "| path | requests | p50 ms | p90 ms | p99 ms |", "|---|---|---|---|---|", *rows, "",
        f"OpenAI over /predictions: p50 **{o['p50_ratio']}x**, {o['tail_ratio']}.", "",
    ]
