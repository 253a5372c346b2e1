"""The highest open-loop rate within a p99 target: one procedure for the benchmark and the tuner.

Start at a rate, step up or down geometrically until a passing and a failing rate bracket the
answer, then bisect to a resolution. `make bench` and `make tune` both call it, with the same
point length and the same pass rule, so the capacity one records the other can reproduce.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional, Protocol

# Served throughput below this share of the offered rate means the server did not keep up.
KEEP_UP = 0.95
# The benchmark's open-loop point: windows this long under benchmarks.load.stats.StabilityRule()'s
# defaults (p99 over the last 3 stable windows, at most 8). The tuner's verification measures with
# the same point: the p99 of a point depends on its length (a rare stall of a few tens of ms
# weighs more in 2,000 requests than in 7,000), so only the same point reproduces a capacity.
REFERENCE_WINDOW_S = 5.0


class RatePoint(Protocol):
    """One open-loop point as the search reads it: a Point, or a mix's (benchmarks.load.mix.MixPoint)."""

    rate_rps: float  # nominal Poisson rate
    offered_rps: float
    achieved_rps: float
    p99_ms: Optional[float]
    stable: bool  # benchmarks.load.stats.StabilityRule held

    def passes(self, slo_ms: float) -> bool: ...


def kept_up(achieved_rps: float, offered_rps: float) -> bool:
    return achieved_rps >= KEEP_UP * offered_rps


@dataclass(frozen=True)
class Point:
    """One open-loop measurement at one Poisson rate, as the bench's capacity search, the tuner (a
    candidate's point: `candidate` its key), its checkpoint and the reports read it. A scout only
    brackets the SLO for the bench's search: its few windows are not asked to agree (`stable`), and
    it never sets a capacity (runner.best_within skips it)."""

    candidate: str
    rate_rps: float  # nominal Poisson rate
    offered_rps: float  # scheduled in the measured windows / their length
    achieved_rps: float
    p50_ms: Optional[float]
    p99_ms: Optional[float]
    errors: int
    seconds: float  # wall time under load, warm-up windows included
    overhead_s: float = 0.0  # server stop/start and warm-up paid just before this point
    mean_batch: Optional[float] = None
    stable: bool = True  # benchmarks.load.stats.StabilityRule held
    warnings: tuple[str, ...] = ()
    others_cpu_pct: Optional[float] = None  # CPU other processes used meanwhile (100 = one core)
    # Recorded since reports print a thin p99 as its p90 and sample count (stats.tail_text): None
    # in points measured before.
    p90_ms: Optional[float] = None
    samples: Optional[int] = None  # the requests the latency figures are over
    remeasured_p99_ms: tuple[Optional[float], ...] = ()  # near the SLO: every measurement's p99 (median_point)
    unanswered: int = 0  # requests still unanswered when the point's drain time ran out
    scout: bool = False

    @classmethod
    def of(cls, figures: dict, candidate: str = "", scout: bool = False, seconds: Optional[float] = None,
           overhead_s: float = 0.0) -> Point:
        """From a load result's figures (LoadResult.figures(), runner.point's)."""
        latency = figures.get("latency_ms") or {}
        return cls(candidate, float(figures["level"]), float(figures.get("offered_rps") or figures["level"]),
                   float(figures.get("throughput_rps") or 0.0), latency.get("p50_ms"), latency.get("p99_ms"),
                   int(sum((figures.get("errors") or {}).values())),
                   round(figures.get("seconds", 0.0) if seconds is None else seconds, 2), round(overhead_s, 2),
                   (figures.get("server") or {}).get("mean_batch_size"), scout or bool(figures.get("stable", True)),
                   tuple(figures.get("warnings") or ()),
                   ((figures.get("resources") or {}).get("others") or {}).get("cpu_pct"), latency.get("p90_ms"),
                   latency.get("count"), unanswered=int(figures.get("unanswered") or 0), scout=scout)

    def passes(self, slo_ms: float) -> bool:
        """Stable, within the p99 target, every request answered, the offered rate kept up with.
        Never true of an unstable point: its windows disagree, so its p99 is no figure of the rate
        and it sets no capacity (it is still reported, marked unstable)."""
        return (self.stable and self.p99_ms is not None and self.p99_ms <= slo_ms and self.errors == 0
                and not self.unanswered and kept_up(self.achieved_rps, self.offered_rps))

    @property
    def latency(self) -> dict:
        """The latency figures as stats.tail_text reads them."""
        return {"count": self.samples, "p90_ms": self.p90_ms, "p99_ms": self.p99_ms}

    def to_json(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("unanswered", "scout") or v}
        return {**out, "warnings": list(self.warnings), "remeasured_p99_ms": list(self.remeasured_p99_ms)}

    @classmethod
    def from_json(cls, raw: dict) -> Point:
        return cls(**{**raw, "warnings": tuple(raw.get("warnings", ())),
                      "remeasured_p99_ms": tuple(raw.get("remeasured_p99_ms", ()))})


@dataclass(frozen=True)
class RateSettings:
    step: float = 1.25  # first rate factor while no bracket is found (then 1.25^2, 1.25^3, ...)
    resolution: float = 1.06  # stop when failing rate / passing rate is at most this
    max_points: int = 6
    min_rps: float = 0.5

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class RateSearch:
    points: tuple[RatePoint, ...]  # measured by this search (not the known ones)
    best: Optional[RatePoint]  # the highest passing rate, known points included


def find_max_rate(probe: Callable[[float], RatePoint], start_rps: float, slo_ms: float,
                  settings: RateSettings = RateSettings(), known: Sequence[RatePoint] = ()) -> RateSearch:
    """`known`: points measured before (the benchmark's fixed rates): they bracket from the start."""
    points: list[RatePoint] = []
    low: Optional[RatePoint] = None  # highest passing
    high: Optional[float] = None  # lowest failing rate

    def note(point: RatePoint) -> None:
        nonlocal low, high
        if point.stable and point.passes(slo_ms):
            if low is None or point.rate_rps > low.rate_rps:
                low = point
        elif high is None or point.rate_rps < high:
            high = point.rate_rps

    for point in known:
        note(point)
    if low is not None and high is not None and high < low.rate_rps:
        high = min((p.rate_rps for p in known if not (p.stable and p.passes(slo_ms)) and p.rate_rps > low.rate_rps),
                   default=None)
    rate = max(start_rps, settings.min_rps)
    step = settings.step  # grows while the rate keeps moving the same way: far-off starts cost few points
    while len(points) < settings.max_points:
        if low is not None and high is not None:
            if high / low.rate_rps <= settings.resolution:
                break
            rate = math.sqrt(low.rate_rps * high)
        point = probe(rate)
        points.append(point)
        note(point)
        if low is not None and high is not None:
            continue
        # No bracket yet. Far from the SLO (p99 under half of it, or over twice it) the step grows
        # with every move the same way; near it, steps stay small.
        far = point.p99_ms is None or not slo_ms / 2 <= point.p99_ms <= 2 * slo_ms
        step = step * settings.step if far and len(points) > 1 else settings.step
        if low is not None:
            rate *= step
        elif 0 < point.achieved_rps and not kept_up(point.achieved_rps, point.offered_rps):
            # Overloaded, the server still served about its capacity: a rate within the SLO is
            # below that, so go there at once instead of stepping down from far above.
            rate = min(rate / settings.step, KEEP_UP * point.achieved_rps)
        else:
            rate /= step
        if rate < settings.min_rps:
            break
    return RateSearch(tuple(points), low)
