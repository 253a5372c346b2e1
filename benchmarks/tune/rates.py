"""One candidate's highest open-loop rate within the SLO, found through a measurer.

Start at a rate, step up or down geometrically until a passing and a failing rate bracket the
answer, then bisect to a resolution. The measurer is anything with `measure(phase, candidate,
rate)` and `finish()`: TorchServe itself (measure.ServedMeasurer), the checkpoint replaying it
(checkpoint.Replaying), or a synthetic server in the unit tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Protocol, Tuple

from benchmarks.tune.results import KEEP_UP, CandidateResult, Point
from benchmarks.tune.service_model import Prediction
from benchmarks.tune.space import Candidate


class Measurer(Protocol):
    def measure(self, phase: str, candidate: Candidate, rate_rps: float) -> Point:
        """One open-loop point of `candidate` at `rate_rps` (its server started on demand)."""

    def finish(self) -> None:
        """Stop the current candidate's server, if one runs."""


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
    points: Tuple[Point, ...]
    best: Optional[Point]  # the highest passing rate


def find_max_rate(probe: Callable[[float], Point], start_rps: float, slo_ms: float,
                  settings: RateSettings = RateSettings()) -> RateSearch:
    points: List[Point] = []
    low: Optional[Point] = None  # highest passing
    high: Optional[float] = None  # lowest failing rate
    rate = max(start_rps, settings.min_rps)
    step = settings.step  # grows while the rate keeps moving the same way: far-off starts cost few points
    while len(points) < settings.max_points:
        point = probe(rate)
        points.append(point)
        if point.passes(slo_ms):
            if low is None or rate > low.rate_rps:
                low = point
        elif high is None or rate < high:
            high = rate
        if low is not None and high is not None:
            if high / low.rate_rps <= settings.resolution:
                break
            rate = math.sqrt(low.rate_rps * high)
            continue
        # No bracket yet. Far from the SLO (p99 under half of it, or over twice it) the step grows
        # with every move the same way; near it, steps stay small.
        far = point.p99_ms is None or not slo_ms / 2 <= point.p99_ms <= 2 * slo_ms
        step = step * settings.step if far and len(points) > 1 else settings.step
        if low is not None:
            rate *= step
        elif 0 < point.achieved_rps < KEEP_UP * point.offered_rps:
            # Overloaded, the server still served about its capacity: a rate within the SLO is
            # below that, so go there at once instead of stepping down from far above.
            rate = min(rate / settings.step, KEEP_UP * point.achieved_rps)
        else:
            rate /= step
        if rate < settings.min_rps:
            break
    return RateSearch(tuple(points), low)


def evaluate(candidate: Candidate, start_rps: float, slo_ms: float, measurer: Measurer, phase: str,
             settings: RateSettings, prediction: Optional[Prediction] = None) -> CandidateResult:
    """One candidate's rate search; its server is stopped at the end (a replayed one never started)."""
    try:
        found = find_max_rate(lambda rate: measurer.measure(phase, candidate, rate), start_rps, slo_ms, settings)
    finally:
        measurer.finish()
    return CandidateResult(candidate, phase, found.points, found.best, start_rps, prediction)
