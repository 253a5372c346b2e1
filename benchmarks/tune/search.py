"""The tuner's search logic, with no server in it: measurements come through a function.

Two levels:
- per candidate, the highest open-loop rate that meets the SLO (`find_max_rate`): start at a
  rate, step up or down geometrically until a passing and a failing rate bracket the answer, then
  bisect to a resolution;
- over candidates (`search`): predict every candidate's rate with the service model, measure the
  best predicted one for real (starting at its predicted rate), recalibrate the model with what
  the server sustained, and repeat; stop when the next prediction cannot beat the best measured
  throughput by `min_gain_pct`, when `patience` measured candidates in a row brought less than
  that, or after `max_candidates`.
`grid` measures every candidate with a model-free rate ladder: the exhaustive reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from benchmarks.tune.service_model import Observation, Prediction, ServiceModel
from benchmarks.tune.checkpoint import Checkpoint
from benchmarks.tune.space import Candidate

Progress = Callable[[str], None]
# Served throughput below this share of the offered rate means the server did not keep up.
KEEP_UP = 0.95
# Where a candidate starts when the model predicts it cannot meet the SLO at all: this share of its capacity.
FALLBACK_START = 0.3
# The gain and patience rules apply only once this many candidates were measured by the search.
MIN_CANDIDATES = 3


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
    warnings: Tuple[str, ...] = ()
    others_cpu_pct: Optional[float] = None  # CPU other processes used meanwhile (100 = one core)

    def passes(self, slo_ms: float) -> bool:
        return (self.p99_ms is not None and self.p99_ms <= slo_ms and self.errors == 0
                and self.achieved_rps >= KEEP_UP * self.offered_rps)

    def to_json(self) -> dict:
        out = dict(self.__dict__)
        out["warnings"] = list(self.warnings)
        return out

    @classmethod
    def from_json(cls, raw: dict) -> "Point":
        return cls(**{**raw, "warnings": tuple(raw.get("warnings", ()))})


@dataclass(frozen=True)
class RateSettings:
    step: float = 1.25  # first rate factor while no bracket is found (then 1.25^2, 1.25^3, ...)
    resolution: float = 1.06  # stop when failing rate / passing rate is at most this
    max_points: int = 6
    min_rps: float = 0.5

    def to_json(self) -> dict:
        return dict(self.__dict__)


# The exhaustive grid knows nothing of the model: it climbs from a low rate by doubling.
GRID_RATES = RateSettings(step=2.0, resolution=1.06, max_points=12)
GRID_START_RPS = 8.0


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


@dataclass(frozen=True)
class CandidateResult:
    candidate: Candidate
    phase: str
    points: Tuple[Point, ...]
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


Measure = Callable[[Candidate, float], Point]


def evaluate(candidate: Candidate, start_rps: float, slo_ms: float, measure: Measure, checkpoint: Checkpoint,
             phase: str, settings: RateSettings, prediction: Optional[Prediction] = None,
             finish: Callable[[], None] = lambda: None) -> CandidateResult:
    """One candidate's rate search, each point through the checkpoint; `finish` stops its server
    (a replayed candidate never started one)."""
    def probe(rate: float) -> Point:
        raw = checkpoint.point(phase, candidate.key, rate, lambda: measure(candidate, rate).to_json())
        return Point.from_json(raw)

    try:
        found = find_max_rate(probe, start_rps, slo_ms, settings)
    finally:
        finish()
    return CandidateResult(candidate, phase, found.points, found.best, start_rps, prediction)


@dataclass(frozen=True)
class SearchSettings:
    min_gain_pct: float = 3.0
    max_candidates: int = 6
    patience: int = 2
    rates: RateSettings = field(default_factory=RateSettings)

    def to_json(self) -> dict:
        return {"min_gain_pct": self.min_gain_pct, "max_candidates": self.max_candidates,
                "patience": self.patience, "rates": self.rates.to_json()}


@dataclass(frozen=True)
class SearchResult:
    results: Tuple[CandidateResult, ...]
    chosen: Optional[CandidateResult]
    stop_reason: str
    model: ServiceModel  # calibrated by every measurement
    first_predictions: Tuple[Prediction, ...]  # before any served measurement
    last_predictions: Tuple[Prediction, ...]  # with the final calibration

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.results)


def best_of(results: Sequence[CandidateResult]) -> Optional[CandidateResult]:
    """Highest throughput within the SLO; ties (within 0.5%) go to the lower p99."""
    passing = [r for r in results if r.best is not None]
    if not passing:
        return None
    top = max(r.throughput_rps for r in passing)
    close = [r for r in passing if r.throughput_rps >= top * 0.995]
    return min(close, key=lambda r: (r.best.p99_ms, -r.throughput_rps))


def _observation(result: CandidateResult, rates: RateSettings) -> Observation:
    """What a measured candidate says about the served overhead. With no passing rate at all, the
    lowest failing one bounds the answer from above, and a step under it is the estimate (an
    "infinitely slow" reading would condemn every candidate with that many workers on one bad
    start)."""
    if result.best is not None:
        rps, size = result.throughput_rps, result.best.mean_batch
    else:
        tried = [p.rate_rps for p in result.points]
        rps, size = (min(tried) / rates.step if tried else 0.0), None
    return Observation(result.candidate, rps, size or float(result.candidate.batch_size))


def _predicted(model: ServiceModel, result: CandidateResult, slo_ms: float) -> float:
    return model.predict(result.candidate, slo_ms).rate_rps


def _ranked(model: ServiceModel, candidates: Sequence[Candidate], slo_ms: float) -> List[Prediction]:
    predictions = [model.predict(c, slo_ms) for c in candidates]
    return sorted(predictions, key=lambda p: (-round(p.rate_rps, 6), p.candidate))


def search(candidates: Sequence[Candidate], model: ServiceModel, slo_ms: float, measure: Measure,
           checkpoint: Checkpoint, settings: SearchSettings = SearchSettings(), progress: Progress = print,
           finish: Callable[[], None] = lambda: None, phase: str = "search",
           prior: Sequence[CandidateResult] = ()) -> SearchResult:
    """`prior`: candidates measured before the search (TorchServe's defaults): they calibrate the
    model from the start, and can be chosen when the space holds a candidate that behaves the same."""
    gain = 1.0 + settings.min_gain_pct / 100.0
    in_space = {c.behaviour for c in candidates}
    results: List[CandidateResult] = []
    base = model  # observations are always read against the uncalibrated model
    observations: Dict[int, List[Observation]] = {}
    for known in prior:
        observations.setdefault(known.candidate.workers, []).append(_observation(known, settings.rates))
    model = base.calibrated(observations, slo_ms) if observations else base
    measured = {known.candidate.behaviour for known in prior}
    choosable = [known for known in prior if known.candidate.behaviour in in_space]
    stale = 0
    first: Optional[List[Prediction]] = None
    while True:
        remaining = [c for c in candidates if c.behaviour not in measured]
        ranked = _ranked(model, remaining, slo_ms)
        first = ranked if first is None else first
        best = best_of(choosable + results)
        searched = len(results)
        reason = None
        if not results and ranked and ranked[0].rate_rps <= 0:
            # The in-process fit may be wrong (a busy machine): measure the highest-capacity
            # candidate once rather than trusting a model that has never met the server.
            top = max(ranked, key=lambda p: (p.capacity_rps, p.candidate))
            ranked = [replace(top, rate_rps=max(settings.rates.min_rps, FALLBACK_START * top.capacity_rps))]
            progress("no candidate is predicted to meet the SLO: measuring the highest-capacity one anyway")
        if not ranked or ranked[0].rate_rps <= 0:
            reason = "no unmeasured candidate is predicted to meet the SLO"
        elif searched < MIN_CANDIDATES and len(ranked) > 0:
            reason = None  # a model calibrated on one or two noisy candidates is not trusted to stop
        elif best is not None and ranked[0].rate_rps < _predicted(model, best, slo_ms) * gain:
            # Predictions against a prediction: the calibrated model may still be biased as a whole
            # (its rates all a little high, or low), but not in how candidates compare.
            reason = (f"the best unmeasured candidate ({ranked[0].candidate.key}, predicted {ranked[0].rate_rps:.1f} "
                      f"req/s) is predicted to gain less than {settings.min_gain_pct:g}% over the best measured "
                      f"({best.candidate.key}: predicted {_predicted(model, best, slo_ms):.1f}, measured "
                      f"{best.throughput_rps:.1f} req/s)")
        if reason is None and len(results) >= settings.max_candidates:
            reason = f"measured {len(results)} candidates (the maximum)"
        elif reason is None and searched >= MIN_CANDIDATES and stale >= settings.patience:
            reason = f"the last {stale} measured candidates gained less than {settings.min_gain_pct:g}%"
        if reason is not None:
            progress(f"search stops: {reason}")
            last = [p for p in _ranked(model, candidates, slo_ms)]
            return SearchResult(tuple(prior) + tuple(results), best, reason, model, tuple(first), tuple(last))
        nxt = ranked[0]
        detail = "" if nxt.p99_ms is None else f" at p99 {nxt.p99_ms:.0f} ms, mean batch {nxt.mean_batch:.1f}"
        progress(f"candidate {len(results) + 1}: {nxt.candidate.label} (predicted {nxt.rate_rps:.1f} req/s{detail})")
        result = evaluate(nxt.candidate, nxt.rate_rps, slo_ms, measure, checkpoint, phase, settings.rates, nxt, finish)
        results.append(result)
        measured.add(nxt.candidate.behaviour)
        improved = best is None or result.throughput_rps > best.throughput_rps * gain
        stale = 0 if improved else stale + 1
        observations.setdefault(nxt.candidate.workers, []).append(_observation(result, settings.rates))
        model = base.calibrated(observations, slo_ms)
        overhead = model.overhead(nxt.candidate.workers)
        progress(f"candidate {len(results)}: {result.throughput_rps:.1f} req/s within the SLO "
                 f"(predicted {nxt.rate_rps:.1f}); served overhead with {nxt.candidate.workers} worker(s) now "
                 f"{overhead.per_batch_ms:.1f} ms per batch + {overhead.per_request_ms:.1f} ms per request")


def grid(candidates: Sequence[Candidate], slo_ms: float, measure: Measure, checkpoint: Checkpoint,
         settings: RateSettings = GRID_RATES, start_rps: float = GRID_START_RPS, progress: Progress = print,
         finish: Callable[[], None] = lambda: None, phase: str = "grid") -> Tuple[CandidateResult, ...]:
    """Every candidate, model-free: the exhaustive reference the search is judged against."""
    results = []
    for index, candidate in enumerate(candidates, 1):
        progress(f"grid {index}/{len(candidates)}: {candidate.label}")
        result = evaluate(candidate, start_rps, slo_ms, measure, checkpoint, phase, settings, None, finish)
        progress(f"grid {index}/{len(candidates)}: {result.throughput_rps:.1f} req/s within the SLO")
        results.append(result)
    return tuple(results)
