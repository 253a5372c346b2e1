"""Search strategies behind one small interface, and the loop that runs any of them.

A strategy is Model Analyzer's generator shape: given what has been measured so far, it proposes
the next candidate (and where its rate search starts), or stops and says why. `run` measures each
proposal through a measurer and hands the results back; a strategy never measures, waits or
checkpoints anything itself, so each is tested with no server at all.

- `ModelGuided`: predict every candidate with the service model, propose the best predicted one,
  recalibrate with what the server sustained, repeat; stop when the next prediction cannot beat the
  best measured by `min_gain_pct`, when `patience` measured candidates in a row brought less, or
  after `max_candidates`.
- `Fixed`: a given list in order, model-free: TorchServe's defaults, the shorter delay's point.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Optional, Protocol

from benchmarks.load.budget import Budget
from benchmarks.load.capacity import RateSettings
from benchmarks.tune.rates import Measurer, evaluate
from benchmarks.tune.results import CandidateResult, best_of
from benchmarks.tune.service_model import Observation, Prediction, ServiceModel
from benchmarks.tune.space import Candidate, Space

Progress = Callable[[str], None]
# Where a candidate starts when the model predicts it cannot meet the SLO at all: this share of its capacity.
FALLBACK_START = 0.3
# The gain and patience rules apply only once this many candidates were measured by the search.
MIN_CANDIDATES = 3
# With a time budget and nothing measured yet, what a candidate takes at least (a server start and
# a few points); after that, the longest candidate measured so far.
CANDIDATE_MIN_S = 60.0


@dataclass(frozen=True)
class Proposal:
    candidate: Candidate
    start_rps: float
    prediction: Optional[Prediction] = None


class Strategy(Protocol):
    phase: str  # names its measurements (the checkpoint keys them by it)
    rates: RateSettings  # how each proposal's rate search steps

    def propose(self, measured: Sequence[CandidateResult]) -> Optional[Proposal]:
        """The next candidate given this strategy's measurements so far; None to stop."""

    @property
    def stop_reason(self) -> str:
        """Why it stopped (after propose returned None)."""


@dataclass(frozen=True)
class Run:
    """What one strategy measured, in order, and why it stopped."""

    phase: str
    results: tuple[CandidateResult, ...]
    stop_reason: str

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.results)


def run(strategy: Strategy, measurer: Measurer, slo_ms: float, progress: Progress = print,
        budget: Optional[Budget] = None) -> Run:
    """`budget`: a proposal that would not end within it is not measured, and the run stops there; a
    candidate whose next point would not end within it keeps the points measured until then."""
    results: list[CandidateResult] = []
    reason = None
    while (proposal := strategy.propose(tuple(results))) is not None:
        need = max((r.seconds for r in results), default=CANDIDATE_MIN_S)
        if budget is not None and not budget.allows(f"{strategy.phase} {proposal.candidate.label}", need):
            reason = (f"time budget of {budget.seconds / 60:g} min spent ({budget.spent_s() / 60:.1f} min): "
                      f"{proposal.candidate.label} and what would follow not measured")
            break
        n = len(results) + 1
        progress(f"{strategy.phase} {n}: {proposal.candidate.label} from {proposal.start_rps:.1f} req/s")
        result = evaluate(proposal.candidate, proposal.start_rps, slo_ms, measurer, strategy.phase, strategy.rates,
                          proposal.prediction, budget)
        progress(f"{strategy.phase} {n}: {result.throughput_rps:.1f} req/s within the SLO")
        results.append(result)
    reason = reason or strategy.stop_reason
    progress(f"{strategy.phase} stops: {reason}")
    return Run(strategy.phase, tuple(results), reason)


class Fixed:
    """Every proposal of a given list, in order."""

    stop_reason = "every listed candidate measured"

    def __init__(self, proposals: Sequence[Proposal], phase: str, rates: RateSettings) -> None:
        self.proposals, self.phase, self.rates = tuple(proposals), phase, rates

    def propose(self, measured: Sequence[CandidateResult]) -> Optional[Proposal]:
        return self.proposals[len(measured)] if len(measured) < len(self.proposals) else None


@dataclass(frozen=True)
class SearchSettings:
    min_gain_pct: float = 3.0
    max_candidates: int = 6
    patience: int = 2
    rates: RateSettings = field(default_factory=RateSettings)
    # A shorter batch delay wins when its capacity is within this % of the best: at low load
    # every request waits up to the delay for a batch that does not fill.
    tie_pct: float = 10.0

    def to_json(self) -> dict:
        return {"min_gain_pct": self.min_gain_pct, "max_candidates": self.max_candidates,
                "patience": self.patience, "rates": self.rates.to_json(), "tie_pct": self.tie_pct}


@dataclass(frozen=True)
class SearchResult:
    """The model-guided search's outcome: what it measured (prior candidates first), its pick and
    its model's predictions before any served measurement and with the final calibration."""

    results: tuple[CandidateResult, ...]
    chosen: Optional[CandidateResult]
    stop_reason: str
    model: ServiceModel
    first_predictions: tuple[Prediction, ...]
    last_predictions: tuple[Prediction, ...]

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.results)


def observation(result: CandidateResult, rates: RateSettings) -> Observation:
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


class ModelGuided:
    """`prior`: candidates measured before the search (TorchServe's defaults): they calibrate the
    model from the start, and can be chosen when the space holds a candidate that behaves the same."""

    phase = "search"

    def __init__(self, candidates: Sequence[Candidate], model: ServiceModel, slo_ms: float,
                 settings: SearchSettings = SearchSettings(), prior: Sequence[CandidateResult] = (),
                 progress: Progress = print) -> None:
        self.candidates, self.base, self.slo_ms = tuple(candidates), model, slo_ms
        self.settings, self.rates, self.prior, self.progress = settings, settings.rates, tuple(prior), progress
        self.gain = 1.0 + settings.min_gain_pct / 100.0
        in_space = {c.behaviour for c in self.candidates}
        self.choosable = [known for known in self.prior if known.candidate.behaviour in in_space]
        self.model = self.base
        self.first: Optional[tuple[Prediction, ...]] = None
        self.stop_reason = ""

    def calibrated(self, measured: Sequence[CandidateResult]) -> ServiceModel:
        """The fitted model with the served overhead learned from every measurement (always read
        against the uncalibrated model, so the order of measurements does not matter)."""
        observations: dict[int, list[Observation]] = {}
        for result in self.prior + tuple(measured):
            observations.setdefault(result.candidate.workers, []).append(observation(result, self.rates))
        return self.base.calibrated(observations, self.slo_ms) if observations else self.base

    def ranked(self, candidates: Sequence[Candidate]) -> list[Prediction]:
        predictions = [self.model.predict(c, self.slo_ms) for c in candidates]
        return sorted(predictions, key=lambda p: (-round(p.rate_rps, 6), p.candidate))

    def stale(self, measured: Sequence[CandidateResult]) -> int:
        """How many of the last measured candidates in a row did not beat the best before them."""
        count = 0
        for index, result in enumerate(measured):
            before = best_of(self.choosable + list(measured[:index]))
            count = 0 if before is None or result.throughput_rps > before.throughput_rps * self.gain else count + 1
        return count

    def propose(self, measured: Sequence[CandidateResult]) -> Optional[Proposal]:
        self.model = self.calibrated(measured)
        if measured:
            last, overhead = measured[-1], self.model.overhead(measured[-1].candidate.workers)
            self.progress(f"served overhead with {last.candidate.workers} worker(s) now {overhead.per_batch_ms:.1f} "
                          f"ms per batch + {overhead.per_request_ms:.1f} ms per request")
        done = {r.candidate.behaviour for r in self.prior + tuple(measured)}
        ranked = self.ranked([c for c in self.candidates if c.behaviour not in done])
        self.first = tuple(ranked) if self.first is None else self.first
        if not measured and ranked and ranked[0].rate_rps <= 0:
            # The in-process fit may be wrong (a busy machine): measure the highest-capacity
            # candidate once rather than trusting a model that has never met the server.
            top = max(ranked, key=lambda p: (p.capacity_rps, p.candidate))
            ranked = [replace(top, rate_rps=max(self.rates.min_rps, FALLBACK_START * top.capacity_rps))]
            self.progress("no candidate is predicted to meet the SLO: measuring the highest-capacity one anyway")
        self.stop_reason = self._stop_reason(measured, ranked)
        if self.stop_reason:
            return None
        nxt = ranked[0]
        detail = "" if nxt.p99_ms is None else f" at p99 {nxt.p99_ms:.0f} ms, mean batch {nxt.mean_batch:.1f}"
        self.progress(f"predicted {nxt.rate_rps:.1f} req/s{detail} for {nxt.candidate.key}")
        return Proposal(nxt.candidate, nxt.rate_rps, nxt)

    def _stop_reason(self, measured: Sequence[CandidateResult], ranked: Sequence[Prediction]) -> str:
        if not ranked or ranked[0].rate_rps <= 0:
            return "no unmeasured candidate is predicted to meet the SLO"
        # A model calibrated on one or two noisy candidates is not trusted to stop the search.
        trusted = len(measured) >= MIN_CANDIDATES
        best = best_of(self.choosable + list(measured))
        predicted_best = self.model.predict(best.candidate, self.slo_ms).rate_rps if best and trusted else 0.0
        if trusted and best is not None and ranked[0].rate_rps < predicted_best * self.gain:
            # Predictions against a prediction: the calibrated model may still be biased as a whole
            # (its rates all a little high, or low), but not in how candidates compare.
            return (f"the best unmeasured candidate ({ranked[0].candidate.key}, predicted {ranked[0].rate_rps:.1f} "
                    f"req/s) is predicted to gain less than {self.settings.min_gain_pct:g}% over the best measured "
                    f"({best.candidate.key}: predicted {predicted_best:.1f}, measured {best.throughput_rps:.1f} req/s)")
        if len(measured) >= self.settings.max_candidates:
            return f"measured {len(measured)} candidates (the maximum)"
        if trusted and self.stale(measured) >= self.settings.patience:
            return (f"the last {self.stale(measured)} measured candidates gained less than "
                    f"{self.settings.min_gain_pct:g}%")
        return ""

    def result(self, searched: Run) -> SearchResult:
        return SearchResult(self.prior + searched.results, best_of(self.choosable + list(searched.results)),
                            searched.stop_reason, self.model, self.first or (), tuple(self.ranked(self.candidates)))


def _delay(result: CandidateResult) -> int:
    return result.candidate.behaviour[3]  # 0 for batch size 1: no wait at all


def preferred(results: Sequence[CandidateResult], tie_pct: float) -> Optional[CandidateResult]:
    """The capacity winner, unless a candidate within `tie_pct` of it waits less for its batches:
    then the best of those with the shortest delay. Every millisecond counts: at one client a
    request waits the whole delay (docs/results.md measures how much of a p50 that is)."""
    best = best_of(results)
    if best is None:
        return None
    close = [r for r in results if r.best is not None and r.throughput_rps >= best.throughput_rps * (1 - tie_pct / 100)]
    shortest = min(_delay(r) for r in close)
    return best_of([r for r in close if _delay(r) == shortest])


def shorter_delay(result: SearchResult, space: Space, measurer: Measurer, slo_ms: float,
                  settings: SearchSettings, progress: Progress = print, budget: Optional[Budget] = None) -> SearchResult:
    """The search ranks by capacity alone, where a longer delay costs nothing. At low load it costs
    every request the delay: measure the chosen workers and batch size at the space's shortest
    delay too (unless measured), then choose by `preferred`. A tie of 0: capacity alone decides,
    nothing more is measured."""
    if result.chosen is None or settings.tie_pct <= 0:
        return result
    behaviours = {c.behaviour for c in space.candidates()}
    results = list(result.results)
    chosen = result.chosen.candidate
    shorter = replace(chosen, max_batch_delay_ms=min(space.delays_ms))
    if shorter.behaviour != chosen.behaviour and shorter.behaviour not in {r.candidate.behaviour for r in results}:
        progress(f"{chosen.label} chosen by capacity; measuring it at delay {shorter.max_batch_delay_ms} ms too")
        start = result.chosen.best.rate_rps
        results += run(Fixed([Proposal(shorter, start)], "delay", settings.rates), measurer, slo_ms, progress,
                       budget).results
    choice = preferred([r for r in results if r.candidate.behaviour in behaviours], settings.tie_pct)
    if choice is not None and choice.candidate != chosen:
        progress(f"chosen: {choice.candidate.label}, {choice.throughput_rps:.1f} req/s (within {settings.tie_pct:g}% "
                 f"of {result.chosen.throughput_rps:.1f}, shorter wait at low load)")
    return replace(result, results=tuple(results), chosen=choice)
