"""Speculative decoding by prompt lookup: draft the tokens that followed the latest earlier
occurrence of a sequence's last n-gram (no second model), verify them in one forward pass of the
target model, keep the longest prefix the model agrees with plus the model's own next token.

Greedy only: a token is kept only if it is the model's own argmax there, so the output is the
greedy output without speculation, whatever the draft was. The number of drafted tokens adapts to
what the sequence has been accepting (settings.causal_lm.speculation: lookup).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_NGRAM = 3


def lookup_draft(tokens: Sequence[int], count: int, max_ngram: int = MAX_NGRAM) -> list[int]:
    """Up to `count` tokens that followed the latest earlier occurrence of the longest (<= max_ngram)
    suffix of `tokens` found earlier in `tokens`; [] when none recurs."""
    tokens = list(tokens)
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + count]
    return []


@dataclass
class DraftLength:
    """How many tokens to draft next for one sequence: grows while drafts are accepted whole,
    shrinks when they are rejected outright."""

    current: int = 4
    low: int = 1
    high: int = 8
    proposed: int = 0
    accepted: int = 0

    def update(self, drafted: int, kept: int) -> None:
        self.proposed += drafted
        self.accepted += kept
        if drafted and kept == drafted:
            self.current = min(self.high, self.current + 1)
        elif drafted and kept == 0:
            self.current = max(self.low, self.current - 1)
