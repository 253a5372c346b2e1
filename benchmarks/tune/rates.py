"""One candidate's highest open-loop rate within the SLO, found through a measurer.

The search itself is benchmarks.load.capacity's (the benchmark's too). The measurer is anything
with `measure(phase, candidate, rate)` and `finish()`: TorchServe itself (measure.ServedMeasurer),
the checkpoint replaying it (checkpoint.Replaying), or a synthetic server in the unit tests.
"""

from __future__ import annotations

from typing import Optional, Protocol

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
             settings: RateSettings, prediction: Optional[Prediction] = None) -> CandidateResult:
    """One candidate's rate search; its server is stopped at the end (a replayed one never started)."""
    try:
        found = find_max_rate(lambda rate: measurer.measure(phase, candidate, rate), start_rps, slo_ms, settings)
    finally:
        measurer.finish()
    return CandidateResult(candidate, phase, found.points, found.best, start_rps, prediction)
