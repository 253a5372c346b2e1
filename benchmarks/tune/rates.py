"""One candidate's highest open-loop rate within the SLO, found through a measurer.

The search itself is benchmarks.load.capacity's (the benchmark's too). The measurer is anything
with `measure(phase, candidate, rate)` and `finish()`: TorchServe itself (measure.ServedMeasurer),
the checkpoint replaying it (checkpoint.Replaying), or a synthetic server in the unit tests.
"""

from __future__ import annotations

from typing import Optional, Protocol

from benchmarks.load.budget import Budget, BudgetSpent
from benchmarks.load.capacity import RateSettings, find_max_rate
from benchmarks.tune.results import CandidateResult, Point
from benchmarks.tune.service_model import Prediction
from benchmarks.tune.space import Candidate


class Measurer(Protocol):
    def measure(self, phase: str, candidate: Candidate, rate_rps: float) -> Point:
        """One open-loop point of `candidate` at `rate_rps` (its server started on demand)."""

    def finish(self) -> None:
        """Stop the current candidate's server, if one runs."""


def evaluate(candidate: Candidate, start_rps: float, slo_ms: float, measurer: Measurer, phase: str,
             settings: RateSettings, prediction: Optional[Prediction] = None,
             budget: Optional[Budget] = None) -> CandidateResult:
    """One candidate's rate search; its server is stopped at the end (a replayed one never started).
    `budget`: a point that would not end within it (as long as this candidate's longest so far) is not
    measured; the candidate's result is then the points measured until there."""
    points: list[Point] = []

    def probe(rate: float) -> Point:
        if budget is not None and points:
            budget.require(f"{phase} {candidate.label} at {rate:.1f} req/s",
                           max(p.seconds + p.overhead_s for p in points))
        points.append(measurer.measure(phase, candidate, rate))
        return points[-1]

    try:
        found = find_max_rate(probe, start_rps, slo_ms, settings)
        measured, best = found.points, found.best
    except BudgetSpent:
        measured = tuple(points)
        best = max((p for p in points if p.passes(slo_ms)), key=lambda p: p.rate_rps, default=None)
    finally:
        measurer.finish()
    return CandidateResult(candidate, phase, measured, best, start_rps, prediction)
