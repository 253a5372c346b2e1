"""Generation figures on Prometheus (through the engine adapter's MetricsSink, handlers/engines/), the
same names in both modes: tokens made and tokens/s, time to first token and inter-token latency (sums
and counts, so a dashboard divides rates), running and waiting sequences, KV-cache bytes, and the
prefix cache's hits, misses and reuse."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from handlers.engines import MetricsSink, model_dims

COUNTERS = ("GenerationTokens", "GenerationFirstTokens", "GenerationTimeToFirstTokenMs", "GenerationInterTokens",
            "GenerationInterTokenMs", "GenerationReleasedOnDisconnect")


@dataclass
class Figures:
    """What was generated since the last report."""

    tokens: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    released: int = 0
    running: int = 0
    waiting: int = 0
    peak_running: int = 0  # the most sequences that ran together since the last report
    steps: int = 0  # decoding steps that moved a sequence (the async engine loop counts them)

    def first_tokens(self, sequences: Iterable, since: Callable[[Any], float]) -> None:
        """Each sequence's first token (its prefill's), `since(seq)`: when its wait began."""
        for seq in sequences:
            self.tokens += 1
            self.ttft_ms.append((seq.token_times[0] - since(seq)) * 1000.0)

    def advanced(self, sequences: Iterable) -> None:
        """The tokens a decoding step gave these sequences, and the gap each waited per token."""
        for seq in sequences:  # a speculative step can give a sequence several tokens at once
            self.tokens += seq.added
            gap = (seq.token_times[-1] - seq.token_times[-1 - seq.added]) * 1000.0
            self.gaps_ms.extend([gap / seq.added] * seq.added)


class TokenRate:
    """Tokens per second over windows of at least `every_s` of wall time: a step is milliseconds."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s, self.tokens, self.since = every_s, 0, time.perf_counter()

    def add(self, tokens: int) -> Optional[float]:
        """The rate once a window closes, else None."""
        self.tokens += tokens
        now = time.perf_counter()
        if now - self.since < self.every_s:
            return None
        rate = self.tokens / (now - self.since)
        self.tokens, self.since = 0, now
        return round(rate, 1)


def emit(metrics: MetricsSink, model_name: str, figures: Figures, engine, tokens_per_s: Optional[float] = None) -> None:
    """Counters for what happened, gauges for the state now, into the engine's sink."""
    dims = model_dims(model_name)

    def count(name: str, value: float) -> None:
        metrics.count(name, value, dims, "Count")

    def gauge(name: str, value: float, unit: str = "Count") -> None:
        metrics.gauge(name, value, unit, dims)

    counters: Mapping[str, float] = {
        "GenerationTokens": figures.tokens, "GenerationFirstTokens": len(figures.ttft_ms),
        "GenerationTimeToFirstTokenMs": sum(figures.ttft_ms), "GenerationInterTokens": len(figures.gaps_ms),
        "GenerationInterTokenMs": sum(figures.gaps_ms), "GenerationReleasedOnDisconnect": figures.released}
    for name, value in counters.items():
        count(name, value)
    gauge("GenerationRunningSequences", figures.running)
    # A burst shorter than the report interval shows here, not in the running gauge of its end.
    gauge("GenerationPeakRunningSequences", max(figures.peak_running, figures.running))
    gauge("GenerationWaitingSequences", figures.waiting)
    if tokens_per_s is not None:
        gauge("GenerationTokensPerSecond", tokens_per_s)
    gauge("GenerationCacheBytes", engine.cache_bytes, "Bytes")
    cache = engine.prefix_cache
    if cache is not None:
        counts = cache.take_counts()
        for name, value in {"GenerationPrefixCacheHits": counts.hits, "GenerationPrefixCacheMisses": counts.misses,
                            "GenerationPrefixCacheReusedTokens": counts.reused_tokens,
                            "GenerationPrefixCacheEvictions": counts.evictions}.items():
            count(name, value)
        gauge("GenerationPrefixCacheBytes", cache.nbytes, "Bytes")


def loop_emitter(metrics: Optional[MetricsSink], model_name: str) -> Callable:
    """The engine loop's reporter (its Figures, from the loop's thread) into the sink the engine
    adapter gave the worker at start-up (None: nothing is reported)."""
    lock = threading.Lock()
    rate = TokenRate(every_s=0.0)  # the loop reports about once a second already

    def report(figures: Figures, engine) -> None:
        if metrics is None:
            return
        with lock:
            emit(metrics, model_name, figures, engine, rate.add(figures.tokens))

    return report
