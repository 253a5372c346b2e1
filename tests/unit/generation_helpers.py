"""Shared by the generation tests: a random-weight engine, requests by token ids, and a fake
TorchServe frontend driving the continuous-batching loop."""

from __future__ import annotations

import json

import torch

from handlers.generation.engine import Engine
from handlers.generation.params import GenerationRequest


def random_engine(seed: int) -> Engine:
    """A GPT-2 with random weights: the cache's bookkeeping must be right for any weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=211, n_layer=2, n_head=2, n_embd=32, n_positions=128)).eval()
    return Engine(lm, lambda ids: " ".join(map(str, ids)), eos_id=210, max_positions=128)


def ids_request(prompt, new_tokens=24, **kw) -> GenerationRequest:
    return GenerationRequest(prompt="-", prompt_ids=tuple(prompt), max_new_tokens=new_tokens, **kw)


def call(handler, context, batch, headers=None):
    """One TorchServe call: `batch` is [(request id, body or None for a running request)];
    `headers`: {request id: its HTTP headers}."""
    context.request_ids = {idx: rid for idx, (rid, _) in enumerate(batch)}
    context.headers = {idx: (headers or {}).get(rid, {}) for idx, (rid, _) in enumerate(batch)}
    context.statuses.clear()
    data = [{} if body is None else {"body": json.dumps(body).encode()} for _, body in batch]
    answers = handler.handle(data, context)
    more = [c(None) for c in context.stopping_criteria]
    return answers, more


def run_continuous(handler, context, arrivals, headers=None):
    """Drive the continuous-batching loop like the frontend: `arrivals` {call number: [(rid, body)]}.
    Returns {rid: [answers]} and {rid: [more flags]}."""
    running, answers, flags, step = [], {}, {}, 0
    while running or any(k >= step for k in arrivals):
        batch = [(rid, None) for rid in running] + arrivals.get(step, [])
        step += 1
        if not batch:
            continue
        out, more = call(handler, context, batch, headers)
        running = []
        for (rid, _), answer, flag in zip(batch, out, more):
            answers.setdefault(rid, []).append(answer)
            flags.setdefault(rid, []).append(flag)
            if flag is False:
                running.append(rid)
    return answers, flags
