"""A traffic mix: one open-loop Poisson stream whose requests go to several models in given shares.

Each arrival goes to model m with probability share(m) (a shuffled, fixed sequence: the shares hold
exactly over every 1,000 arrivals), so each model sees Poisson arrivals at share x rate. A point
passes when every model is within its own p99 target, answered everything and was kept up with;
the rate search (benchmarks.load.capacity) sees the worst model's p99 as a fraction of its own
target, with a target of 1.0.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Optional

from benchmarks.load import loadgen, stats
from benchmarks.load.capacity import kept_up
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.loadgen import LoadResult, Payload

# The search's "SLO": every model's p99 divided by its own target.
NORMALISED_SLO = 1.0
SEQUENCE_LENGTH = 1000
MAX_WINDOW_S = 30.0


@dataclass(frozen=True)
class Mix:
    """Models and their shares of the requests (summing to 1), each with its p99 target (ms)."""

    shares: Mapping[str, float]
    slo_ms: Mapping[str, float]

    def __post_init__(self) -> None:
        if not self.shares:
            raise BenchmarkError("a mix needs at least one model")
        for name, share in self.shares.items():
            if not share > 0:
                raise BenchmarkError(f"mix: {name}'s share must be > 0, got {share}")
            if name not in self.slo_ms or not self.slo_ms[name] > 0:
                raise BenchmarkError(f"mix: {name} has no p99 target (catalogue slo_ms)")
        if abs(sum(self.shares.values()) - 1.0) > 1e-6:
            raise BenchmarkError(f"mix: shares sum to {sum(self.shares.values()):g}, not 1")

    @classmethod
    def parse(cls, text: str, slo_ms: Mapping[str, float]) -> Mix:
        """'minilm=0.7,efficientnet_lite0=0.3' (weights are normalised: 7,3 means the same)."""
        weights: dict[str, float] = {}
        for part in (p.strip() for p in text.split(",") if p.strip()):
            name, sep, value = part.partition("=")
            name = name.strip()
            try:
                weight = float(value) if sep else float("nan")
            except ValueError:
                weight = float("nan")
            if not name or not math.isfinite(weight) or weight <= 0:
                raise BenchmarkError(f"--mix: {part!r} is not <model>=<share> with a share > 0 "
                                     "(e.g. --mix minilm=0.7,efficientnet_lite0=0.3)")
            if name in weights:
                raise BenchmarkError(f"--mix: {name} named twice")
            weights[name] = weight
        if not weights:
            raise BenchmarkError("--mix: no model given (e.g. --mix minilm=0.7,efficientnet_lite0=0.3)")
        unknown = sorted(set(weights) - set(slo_ms))
        if unknown:
            raise BenchmarkError(f"--mix: {', '.join(unknown)} not in the catalogue (models: {', '.join(slo_ms)})")
        total = sum(weights.values())
        return cls(MappingProxyType({n: w / total for n, w in weights.items()}),
                   MappingProxyType({n: float(slo_ms[n]) for n in weights}))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.shares)

    def label(self) -> str:
        return ", ".join(f"{n} {s:.0%}" for n, s in self.shares.items())

    def to_json(self) -> dict:
        return {"shares": dict(self.shares), "slo_ms": dict(self.slo_ms)}


def mixed_payloads(mix: Mix, payloads: Mapping[str, Sequence[Payload]], seed: int = 0) -> tuple[Payload, ...]:
    """SEQUENCE_LENGTH payloads, each model's count in proportion to its share (largest remainder),
    each tagged and sent to /predictions/<model>, in a seeded random order."""
    exact = {n: s * SEQUENCE_LENGTH for n, s in mix.shares.items()}
    counts = {n: max(1, int(v)) for n, v in exact.items()}
    for name in sorted(exact, key=lambda n: exact[n] - int(exact[n]), reverse=True):
        if sum(counts.values()) >= SEQUENCE_LENGTH:
            break
        counts[name] += 1
    out = []
    for name, count in counts.items():
        own = payloads[name]
        out += [Payload(own[i % len(own)].body, own[i % len(own)].content_type, f"/predictions/{name}", name)
                for i in range(count)]
    random.Random(seed).shuffle(out)
    return tuple(out)


def model_figures(result: LoadResult, model: str) -> dict:
    """One model's part of a mixed open-loop point, over the point's reported windows."""
    start, end = result.interval
    own = [s for s in result.samples if s.tag == model]
    rates = stats.open_loop_rates(own, start, end)
    chosen = stats.select(own, result.mode, start, end, result.window_s)  # as the whole point's figures
    latency = stats.summarize(chosen.latencies_s)
    return {
        "offered_rps": rates.offered_rps,
        "achieved_rps": rates.achieved_rps,
        "requests": rates.scheduled,
        "unanswered": rates.unanswered,
        "errors": chosen.errors,
        "latency_ms": None if latency is None else asdict(latency),
    }


@dataclass(frozen=True)
class MixPoint:
    """One mixed open-loop point, as benchmarks.load.capacity's search reads it."""

    rate_rps: float  # nominal total rate
    offered_rps: float
    achieved_rps: float
    models: Mapping[str, dict]  # model_figures per model
    slo_ms: Mapping[str, float]
    seconds: float
    warnings: tuple[str, ...] = ()
    stable: bool = True  # an unstable point never passes: it sets no capacity

    @classmethod
    def of(cls, result: LoadResult, mix: Mix) -> MixPoint:
        figures = result.figures()
        return cls(float(result.level), float(figures["offered_rps"] or result.level),
                   float(figures["throughput_rps"]),
                   MappingProxyType({m: model_figures(result, m) for m in mix.names}), mix.slo_ms,
                   float(figures["seconds"]), tuple(figures["warnings"]), bool(figures["stable"]))

    def model_p99_ms(self, model: str) -> Optional[float]:
        latency = self.models[model]["latency_ms"]
        return None if latency is None else latency["p99_ms"]

    @property
    def p99_ms(self) -> Optional[float]:
        """The worst model's p99 as a fraction of its own target (the search's SLO is 1.0)."""
        ratios = [self.model_p99_ms(m) for m in self.models]
        if any(r is None for r in ratios):
            return None
        return max(p / self.slo_ms[m] for m, p in zip(self.models, ratios))

    def model_passes(self, model: str) -> bool:
        f, p99 = self.models[model], self.model_p99_ms(model)
        return (p99 is not None and p99 <= self.slo_ms[model] and not f["errors"] and not f["unanswered"]
                and kept_up(f["achieved_rps"], f["offered_rps"]))

    def passes(self, slo_ms: float = NORMALISED_SLO) -> bool:
        return (self.stable and all(self.model_passes(m) for m in self.models)
                and kept_up(self.achieved_rps, self.offered_rps))

    def describe(self) -> str:
        parts = []
        for m in self.models:
            mark = "" if self.model_passes(m) else " FAIL"
            parts.append(f"{m} {self.models[m]['achieved_rps']:.1f} req/s "
                         f"{stats.tail_text(self.models[m]['latency_ms'], 0)} (target p99 {self.slo_ms[m]:g} ms){mark}")
        return (f"{self.achieved_rps:.1f} of {self.offered_rps:.1f} req/s: " + "; ".join(parts)
                + ("" if self.stable else " (unstable: sets no capacity)"))

    def to_json(self) -> dict:
        return {"rate_rps": self.rate_rps, "offered_rps": self.offered_rps, "achieved_rps": self.achieved_rps,
                "passes": self.passes(), "stable": self.stable, "seconds": self.seconds,
                "warnings": list(self.warnings),
                "models": {m: dict(f) for m, f in self.models.items()}}


def window_for(mix: Mix, rate_rps: float, window_s: float, point_requests: int, windows: int) -> float:
    """Each model's reported windows hold at least `point_requests` of its own arrivals."""
    least = min(mix.shares.values()) * max(rate_rps, 1e-9)
    # Capped: a search probing far below capacity must not spend minutes on one point.
    return min(max(window_s, point_requests / (least * windows)), MAX_WINDOW_S)


def mixed_point(target: loadgen.Target, mix: Mix, payloads: Sequence[Payload], rate: float,
                rule: stats.StabilityRule, window_s: float, connections: int,
                progress: Callable[[str], None]) -> MixPoint:
    result = loadgen.open_loop(target, payloads, rate, rule, window_s, connections, seed=int(rate * 1000),
                               drain_s=max(10.0, 2 * window_s), progress=progress)
    return MixPoint.of(result, mix)
