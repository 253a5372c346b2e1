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
    """One open-loop point as the search reads it."""

    rate_rps: float  # nominal Poisson rate
    offered_rps: float
    achieved_rps: float
    p99_ms: Optional[float]
    stable: bool  # benchmarks.load.stats.StabilityRule held

    def passes(self, slo_ms: float) -> bool:
        """Stable, within the p99 target, every request answered, the offered rate kept up with.
        Never true of an unstable point: its windows disagree, so its p99 is no figure of the rate
        and it sets no capacity (it is still reported, marked unstable)."""


def kept_up(achieved_rps: float, offered_rps: float) -> bool:
    return achieved_rps >= KEEP_UP * offered_rps


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
