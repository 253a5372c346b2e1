"""What the tuner believes about a model before (and between) measuring it for real.

- Batch service time, per intra-op thread count: s(b) ~ a + c*b milliseconds, fitted to a few
  in-process measurements of the whole handler (decode, forward, post-process).
- Served overhead, per worker count: time a served batch takes on top of s(b), fitted as
  o_batch + o_request*b to what the real servers sustained. It holds what in-process runs cannot
  see: the worker's IPC and request (de)serialisation, the Java frontend and the load generator
  taking CPU from the same 2 cores, and the handler itself slowed by that contention. Additive on
  purpose: measured here, most of it is per batch or per request, so batching amortises the first
  part; a factor on s(b) instead would make every batch look slower and hide batching from the
  search after one measurement at batch size 1.
- Prediction: the highest Poisson rate whose p99 stays within the SLO, from a small simulation
  of TorchServe's batching rather than a closed formula, because the batch delay matters in a
  non-linear way: a batch of b fills within the delay only when rate x delay reaches b, and under
  load batches fill from the queue whatever the delay. The simulation follows TorchServe 0.12's
  Model.pollInferJob: one worker at a time assembles a batch; it blocks for the first request,
  then takes queued requests at once and waits for more until the delay (counted from the first)
  runs out or the batch is full; then it runs the batch for s(size).

Capacity workers x b / s(b) bounds every prediction; the SLO bounds the useful delay to
SLO - s(b). Arrivals come from one fixed seed, so predictions are smooth across candidates and
repeatable (the checkpoint replay depends on that).
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from types import MappingProxyType
from typing import Optional

from benchmarks.tune.errors import TuneError
from benchmarks.tune.space import Candidate

SIM_REQUESTS = 2500
SIM_SKIP = 250  # the first requests meet an empty system: not steady state
SIM_SEED = 20261121
# Latency the batching simulation does not see: HTTP, the frontend, IPC to the worker and back.
DEFAULT_OVERHEAD_MS = 2.0
# Run-to-run variation of one batch's service time (decode sizes differ, caches, the scheduler).
SERVICE_CV = 0.10
# A served batch is never assumed faster than this share of its in-process time.
MIN_SERVED_SHARE = 0.3


@dataclass(frozen=True)
class FitPoint:
    """One measured batch service time."""

    threads: int
    batch_size: int
    service_ms: float
    source: str = "in-process"

    def to_json(self) -> dict:
        return {"threads": self.threads, "batch_size": self.batch_size, "service_ms": self.service_ms,
                "source": self.source}

    @classmethod
    def from_json(cls, raw: dict) -> FitPoint:
        return cls(int(raw["threads"]), int(raw["batch_size"]), float(raw["service_ms"]), raw.get("source", ""))


@dataclass(frozen=True)
class LinearServiceTime:
    """s(b) = a + c*b, in milliseconds."""

    a_ms: float
    c_ms: float

    def __call__(self, batch_size: int) -> float:
        return self.a_ms + self.c_ms * batch_size

    @classmethod
    def fit(cls, points: Sequence[tuple[int, float]]) -> LinearServiceTime:
        """Least squares; a negative intercept (noise at small b) is refitted through the origin."""
        if not points:
            raise TuneError("no service-time measurements to fit")
        if len({b for b, _ in points}) == 1:
            b, s = points[0][0], sum(s for _, s in points) / len(points)
            return cls(0.0, s / b)
        n = len(points)
        mean_b = sum(b for b, _ in points) / n
        mean_s = sum(s for _, s in points) / n
        var = sum((b - mean_b) ** 2 for b, _ in points)
        c = sum((b - mean_b) * (s - mean_s) for b, s in points) / var
        a = mean_s - c * mean_b
        if a < 0 or c <= 0:
            c = max(sum(b * s for b, s in points) / sum(b * b for b, _ in points), 1e-6)
            a = 0.0 if a < 0 else max(mean_s - c * mean_b, 0.0)
        return cls(a, c)

    def to_json(self) -> dict:
        return {"a_ms": round(self.a_ms, 4), "c_ms": round(self.c_ms, 4)}


@dataclass(frozen=True)
class SimResult:
    p99_ms: float
    mean_batch: float
    utilisation: float


@lru_cache(maxsize=4)
def _unit_arrivals(n: int, seed: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Poisson arrivals at rate 1/ms (cumulative), and service-time noise factors (mean 1)."""
    rng = random.Random(seed)
    t, arrivals = 0.0, []
    for _ in range(n):
        t += rng.expovariate(1.0)
        arrivals.append(t)
    sigma = math.sqrt(math.log(1.0 + SERVICE_CV ** 2))
    noise = tuple(rng.lognormvariate(-sigma * sigma / 2.0, sigma) for _ in range(n))
    return tuple(arrivals), noise


def simulate(service_ms: Callable[[int], float], workers: int, batch_size: int, delay_ms: float, rate_rps: float,
             overhead_ms: float = DEFAULT_OVERHEAD_MS, n: int = SIM_REQUESTS, seed: int = SIM_SEED) -> SimResult:
    """p99 latency (ms) of Poisson traffic at rate_rps through TorchServe's batching (see module doc)."""
    if rate_rps <= 0:
        raise TuneError(f"rate must be > 0, got {rate_rps}")
    unit, noise = _unit_arrivals(n, seed)
    scale = 1000.0 / rate_rps  # unit arrivals are 1 per ms
    arrivals = [u * scale for u in unit]
    free = [0.0] * workers  # when each worker is next idle (a heap)
    lock_free = 0.0  # when the batch assembler lock is next available
    latencies, sizes, busy = [], [], 0.0
    i, k = 0, 0
    while i < n:
        t = max(heapq.heappop(free), lock_free, arrivals[i])
        deadline = t + delay_ms
        j = i + 1
        while j - i < batch_size and j < n:
            if arrivals[j] <= t:  # already queued: taken at once
                j += 1
                if delay_ms <= 0:
                    break
            elif arrivals[j] < deadline:  # arrives while the assembler still waits
                t = arrivals[j]
                j += 1
            else:  # the poll times out
                t = deadline
                break
        size = j - i
        service = service_ms(size) * noise[k % n]
        k += 1
        done = t + service
        busy += service
        lock_free = t
        heapq.heappush(free, done)
        if i >= SIM_SKIP:
            sizes.append(size)
        latencies.extend(done + overhead_ms - arrivals[m] for m in range(max(i, SIM_SKIP), j))
        i = j
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(math.ceil(0.99 * len(latencies))) - 1)]
    span = max(arrivals[-1], 1e-9)
    return SimResult(p99, sum(sizes) / max(1, len(sizes)), busy / (workers * span))


@dataclass(frozen=True)
class Prediction:
    candidate: Candidate
    rate_rps: float  # highest rate with simulated p99 <= SLO; 0 when none
    p99_ms: Optional[float]
    mean_batch: Optional[float]
    capacity_rps: float  # workers x b / s(b): the bound whatever the latency

    def to_json(self) -> dict:
        return {"rate_rps": round(self.rate_rps, 2), "p99_ms": None if self.p99_ms is None else round(self.p99_ms, 1),
                "mean_batch": None if self.mean_batch is None else round(self.mean_batch, 2),
                "capacity_rps": round(self.capacity_rps, 2)}


def max_rate_within(service_ms: Callable[[int], float], candidate: Candidate, slo_ms: float,
                    overhead_ms: float = DEFAULT_OVERHEAD_MS, resolution: float = 1.02) -> Prediction:
    """Highest rate whose simulated p99 is within slo_ms. p99 is not monotone in the rate (a
    long delay hurts most at low rates, where batches never fill), so a coarse scan from the
    capacity downwards finds the top of the feasible region before bisection refines it."""
    b, w = candidate.batch_size, candidate.workers
    capacity = w * b / service_ms(b) * 1000.0
    if service_ms(1) + overhead_ms > slo_ms:
        return Prediction(candidate, 0.0, None, None, capacity)

    def run(rate: float) -> SimResult:
        return simulate(service_ms, w, b, candidate.max_batch_delay_ms, rate, overhead_ms)

    fractions = (0.99, 0.93, 0.85, 0.75, 0.62, 0.5, 0.38, 0.27, 0.18, 0.11, 0.06, 0.03)
    high = None
    for fraction in fractions:
        rate = capacity * fraction
        result = run(rate)
        if result.p99_ms <= slo_ms:
            low, best = rate, result
            break
        high = rate
    else:
        return Prediction(candidate, 0.0, None, None, capacity)
    while high is not None and high / low > resolution:
        mid = math.sqrt(low * high)
        result = run(mid)
        if result.p99_ms <= slo_ms:
            low, best = mid, result
        else:
            high = mid
    return Prediction(candidate, low, best.p99_ms, best.mean_batch, capacity)


@dataclass(frozen=True)
class Overhead:
    """Served time on top of s(b): o_batch + o_request * batch size (ms)."""

    per_batch_ms: float = 0.0
    per_request_ms: float = 0.0

    def __call__(self, batch_size: int) -> float:
        return self.per_batch_ms + self.per_request_ms * batch_size

    @classmethod
    def split_at(cls, batch_size: float, total_ms: float = 1.0) -> Overhead:
        """total_ms at this batch size, half of it per batch and half per request: measured here
        both matter (all per batch would make large batches look free, all per request would hide
        batching's gain)."""
        return cls(total_ms / 2.0, total_ms / (2.0 * batch_size))

    def scaled(self, factor: float) -> Overhead:
        return Overhead(self.per_batch_ms * factor, self.per_request_ms * factor)

    def to_json(self) -> dict:
        return {"per_batch_ms": round(self.per_batch_ms, 3), "per_request_ms": round(self.per_request_ms, 3)}


@dataclass(frozen=True)
class Observation:
    """What the server sustained for one measured candidate."""

    candidate: Candidate
    rate_rps: float  # highest rate within the SLO (or an estimate under the lowest failing one)
    mean_batch: float  # batch size the server formed there


@dataclass(frozen=True)
class ServiceModel:
    """Service time per thread count, plus the served overhead per worker count."""

    by_threads: Mapping[int, LinearServiceTime]
    overhead_by_workers: Mapping[int, Overhead] = field(default_factory=lambda: MappingProxyType({}))
    overhead_ms: float = DEFAULT_OVERHEAD_MS

    @classmethod
    def fit(cls, points: Iterable[FitPoint], overhead_ms: float = DEFAULT_OVERHEAD_MS) -> ServiceModel:
        grouped = {}
        for p in points:
            grouped.setdefault(p.threads, []).append((p.batch_size, p.service_ms))
        if not grouped:
            raise TuneError("no service-time measurements to fit")
        fits = {t: LinearServiceTime.fit(pts) for t, pts in sorted(grouped.items())}
        return cls(MappingProxyType(fits), MappingProxyType({}), overhead_ms)

    def overhead(self, workers: int) -> Overhead:
        """This worker count's overhead; none while it is unmeasured. Borrowing another worker
        count's would carry over what is specific to it (two threads collapsing next to the
        frontend, say), and a pessimistic prediction hides a candidate for good, where an
        optimistic one only costs its measurement."""
        return self.overhead_by_workers.get(workers, Overhead())

    def service(self, candidate: Candidate, extra: Optional[Callable[[int], float]] = None) -> Callable[[int], float]:
        if candidate.threads not in self.by_threads:
            raise TuneError(f"no service-time fit for {candidate.threads} threads (fitted: {sorted(self.by_threads)})")
        base = self.by_threads[candidate.threads]
        more = self.overhead(candidate.workers) if extra is None else extra
        return lambda b: max(base(b) + more(b), MIN_SERVED_SHARE * base(b))

    def predict(self, candidate: Candidate, slo_ms: float) -> Prediction:
        return max_rate_within(self.service(candidate), candidate, slo_ms, self.overhead_ms)

    def scale_matching(self, observation: Observation, slo_ms: float, shape: Overhead) -> float:
        """The factor on `shape` with which this model predicts what the server sustained."""
        candidate, measured_rps = observation.candidate, observation.rate_rps
        base = self.by_threads[candidate.threads](candidate.batch_size)
        unit = max(shape(candidate.batch_size), 1e-9)
        low, high = -base / unit, (20.0 * base + 200.0) / unit

        def rate(factor: float) -> float:
            service = self.service(candidate, shape.scaled(factor))
            return max_rate_within(service, candidate, slo_ms, self.overhead_ms).rate_rps

        if measured_rps <= 0 or rate(high) >= measured_rps:
            return high
        if rate(low) <= measured_rps:
            return low
        while (high - low) * unit > max(0.25, 0.01 * base):  # predicted rate falls as the factor grows
            mid = (low + high) / 2.0
            if rate(mid) >= measured_rps:
                low = mid
            else:
                high = mid
        return (low + high) / 2.0

    def calibrated(self, observations: Mapping[int, Sequence[Observation]], slo_ms: float) -> ServiceModel:
        """Workers -> what that many workers' measured candidates sustained. One overhead per
        worker count, shaped at the batch size the servers formed and scaled so that the model
        predicts what was measured: exactly, for one candidate; for several, the median of their
        matching scales (one noisy candidate cannot drag the others' estimate). Solved for in the
        same shape the predictions then use, so the model reproduces its own observations."""
        fitted = {}
        for workers, seen in observations.items():
            if not seen:
                continue
            shape = Overhead.split_at(sum(o.mean_batch for o in seen) / len(seen))
            fitted[workers] = shape.scaled(statistics.median(self.scale_matching(o, slo_ms, shape) for o in seen))
        return replace(self, overhead_by_workers=MappingProxyType(fitted))

    def to_json(self) -> dict:
        return {"service_ms_by_threads": {str(t): f.to_json() for t, f in self.by_threads.items()},
                "served_overhead_by_workers": {str(w): o.to_json() for w, o in self.overhead_by_workers.items()},
                "latency_overhead_ms": self.overhead_ms}
