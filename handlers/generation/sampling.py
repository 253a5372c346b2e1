"""The next token of each sequence from its logits: greedy (argmax), or sampled with temperature,
top-k and top-p from the sequence's own seeded generator (same seed, same text, whatever else
shares the batch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch

from handlers.generation.params import GenerationRequest


def new_generator(request: GenerationRequest) -> Optional[torch.Generator]:
    """A generator per sampled sequence; None for greedy ones (they draw nothing)."""
    if request.greedy:
        return None
    generator = torch.Generator()
    if request.seed is None:
        generator.seed()
    else:
        generator.manual_seed(request.seed)
    return generator


def sample_one(logits: torch.Tensor, request: GenerationRequest, generator: torch.Generator) -> int:
    """One token from a (vocab,) row of logits. Drawn on the host, whatever device the logits are on:
    the sequence's generator is a host one, so a seed gives the same draws on a CPU and a GPU, and
    the token is read on the host anyway."""
    # Shifted so that the largest score is 0 before dividing: however small the temperature, the
    # scores stay <= 0 (no overflow to inf, whose softmax is NaN) and the best token keeps weight 1.
    scores = logits.double().cpu()  # float64: a temperature under float32's range stays non-zero
    scores = (scores - scores.max()) / request.temperature
    if 0 < request.top_k < scores.numel():
        kth = torch.topk(scores, request.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if request.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        # Keep the smallest head whose mass reaches top_p (the first token always stays).
        drop = ordered.cumsum(-1) - ordered >= request.top_p
        drop[0] = False  # rounding can put the head's own "mass before it" above a tiny top_p
        ordered = ordered.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, ordered)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def next_tokens(logits: torch.Tensor, requests: Sequence[GenerationRequest],
                generators: Sequence[Optional[torch.Generator]]) -> list[int]:
    """(batch, vocab) logits -> one token per row. On a GPU: one copy to the host for the argmax
    of every row and one for all the sampled rows' logits, not one per sequence."""
    chosen = logits.argmax(dim=-1).tolist()
    sampled = [row for row, request in enumerate(requests) if not request.greedy]
    if sampled:
        host = logits[sampled].double().cpu()
        for at, row in enumerate(sampled):
            chosen[row] = sample_one(host[at], requests[row], generators[row])
    return chosen
