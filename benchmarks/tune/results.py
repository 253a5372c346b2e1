"""What the tuner measures and keeps: one open-loop point, one candidate's rate search, the best.

The bottom of the tune wing: strategies, the measurer, the checkpoint, the judge and the report
all speak these types, and this module imports none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from benchmarks.load.capacity import kept_up
from benchmarks.tune.service_model import Prediction
from benchmarks.tune.space import Candidate


@dataclass(frozen=True)
class Point:
    """One open-loop measurement: a candidate at one Poisson rate."""

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
    stable: bool = True
    warnings: tuple[str, ...] = ()
    others_cpu_pct: Optional[float] = None  # CPU other processes used meanwhile (100 = one core)
    # Recorded since reports print a thin p99 as its p90 and sample count (stats.tail_text): None
    # in points measured before.
    p90_ms: Optional[float] = None
    samples: Optional[int] = None  # the requests the latency figures are over
    remeasured_p99_ms: tuple[Optional[float], ...] = ()  # near the SLO: every measurement's p99 (median_point)

    def passes(self, slo_ms: float) -> bool:
        """Stable (an unstable point sets no capacity), within the SLO, no errors, kept up."""
        return (self.stable and self.p99_ms is not None and self.p99_ms <= slo_ms and self.errors == 0
                and kept_up(self.achieved_rps, self.offered_rps))

    @property
    def latency(self) -> dict:
        """The latency figures as stats.tail_text reads them."""
        return {"count": self.samples, "p90_ms": self.p90_ms, "p99_ms": self.p99_ms}

    def to_json(self) -> dict:
        out = dict(self.__dict__)
        out["warnings"] = list(self.warnings)
        out["remeasured_p99_ms"] = list(self.remeasured_p99_ms)
        return out

    @classmethod
    def from_json(cls, raw: dict) -> Point:
        return cls(**{**raw, "warnings": tuple(raw.get("warnings", ())),
                      "remeasured_p99_ms": tuple(raw.get("remeasured_p99_ms", ()))})


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
