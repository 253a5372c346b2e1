"""What the tuner keeps: one candidate's rate search (its open-loop points: benchmarks.load.capacity.Point)
and the best of several.

The bottom of the tune wing: strategies, the measurer, the checkpoint and the report all speak
these types, and this module imports none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from benchmarks.load.capacity import Point
from benchmarks.tune.service_model import Prediction
from benchmarks.tune.space import Candidate


@dataclass(frozen=True)
class CandidateResult:
    """One candidate's rate search: every point measured, and the highest rate within the SLO."""

    candidate: Candidate
    phase: str
    points: tuple[Point, ...]
    best: Optional[Point]
    start_rps: float
    prediction: Optional[Prediction] = None

    @property
    def throughput_rps(self) -> float:
        return self.best.achieved_rps if self.best else 0.0

    @property
    def overhead_s(self) -> float:
        return sum(p.overhead_s for p in self.points)

    @property
    def seconds(self) -> float:
        return sum(p.seconds + p.overhead_s for p in self.points)

    def to_json(self) -> dict:
        return {"candidate": self.candidate.to_json(), "key": self.candidate.key, "phase": self.phase,
                "start_rps": round(self.start_rps, 3), "throughput_rps": self.throughput_rps,
                "best": self.best.to_json() if self.best else None, "points": [p.to_json() for p in self.points],
                "overhead_s": round(self.overhead_s, 2), "seconds": round(self.seconds, 2),
                "prediction": self.prediction.to_json() if self.prediction else None}


def best_of(results: Sequence[CandidateResult]) -> Optional[CandidateResult]:
    """Highest throughput within the SLO; ties (within 0.5%) go to the lower p99."""
    passing = [r for r in results if r.best is not None]
    if not passing:
        return None
    top = max(r.throughput_rps for r in passing)
    close = [r for r in passing if r.throughput_rps >= top * 0.995]
    return min(close, key=lambda r: (r.best.p99_ms, -r.throughput_rps))
