"""Arithmetic on client-side timings: percentiles, windows, rates and the stability rule.

Pure functions over `Sample`s (no clock, no I/O), so the unit tests can feed synthetic timings.

Latency is always measured from a request's *intended* send time: in the closed loop that is the
moment it was sent; in the open loop it is its scheduled Poisson arrival, so a request that had to
wait for a free connection (or for a slow generator) is charged for the wait (no coordinated
omission).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Sequence

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
NO_RESPONSE = 0  # status of a request that got no HTTP answer (connection error or client timeout)


@dataclass(frozen=True)
class Sample:
    """One request: when it was meant to go, when it went, when it came back, and its HTTP status."""

    intended: float
    sent: float
    done: float
    status: int
    tag: str = ""  # which model of a traffic mix (benchmarks/load/mix.py)

    @property
    def latency(self) -> float:
        return self.done - self.intended

    @property
    def send_lag(self) -> float:
        return self.sent - self.intended

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); values must be sorted."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside [0, 100]")
    rank = q / 100.0 * (len(sorted_values) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


@dataclass(frozen=True)
class LatencySummary:
    """Milliseconds. Built from the successful requests only (errors are counted separately)."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float


def summarize(latencies_s: Iterable[float]) -> Optional[LatencySummary]:
    values = sorted(latencies_s)
    if not values:
        return None
    ms = [v * 1000.0 for v in values]
    p50, p90, p95, p99, p999 = (percentile(ms, q) for q in PERCENTILES)
    return LatencySummary(len(ms), sum(ms) / len(ms), p50, p90, p95, p99, p999, ms[-1])


def errors_by_status(samples: Iterable[Sample]) -> Dict[str, int]:
    """Failed requests per status ("0" = no HTTP answer), as JSON-friendly string keys."""
    out: Dict[str, int] = {}
    for sample in samples:
        if not sample.ok:
            out[str(sample.status)] = out.get(str(sample.status), 0) + 1
    return dict(sorted(out.items()))


# -- windows and the stability rule -----------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """The requests that *completed* in [start, end): how many per second, and their p99."""

    start: float
    end: float
    completed: int
    ok: int
    throughput_rps: float
    p99_ms: Optional[float]


def window(samples: Iterable[Sample], start: float, end: float) -> Window:
    inside = [s for s in samples if start <= s.done < end]
    good = sorted(s.latency * 1000.0 for s in inside if s.ok)
    duration = end - start
    if duration <= 0:
        raise ValueError(f"empty window [{start}, {end})")
    return Window(start, end, len(inside), len(good), len(good) / duration,
                  percentile(good, 99.0) if good else None)


def within(values: Sequence[Optional[float]], tolerance_pct: float) -> bool:
    """All present, positive, and each within tolerance_pct of their mean."""
    if not values or any(v is None or v <= 0 for v in values):
        return False
    mean = sum(values) / len(values)
    return all(abs(v - mean) <= mean * tolerance_pct / 100.0 for v in values)


@dataclass(frozen=True)
class StabilityRule:
    """A point is stable when throughput and p99 of each of the last `last` windows are within
    `tolerance_pct` of their mean over those windows; the first `warmup` windows never count; at most
    `max_windows` measured windows are run (then the point is reported as unstable)."""

    tolerance_pct: float = 10.0
    last: int = 3
    max_windows: int = 8
    warmup: int = 1

    def __post_init__(self) -> None:
        if self.tolerance_pct <= 0:
            raise ValueError(f"tolerance_pct must be > 0, got {self.tolerance_pct}")
        if self.last < 1 or self.warmup < 0:
            raise ValueError("last must be >= 1 and warmup >= 0")
        if self.max_windows < self.last:
            raise ValueError(f"max_windows ({self.max_windows}) must be >= last ({self.last})")

    def measured(self, windows: Sequence[Window]) -> Sequence[Window]:
        return windows[self.warmup:]

    def is_stable(self, windows: Sequence[Window]) -> bool:
        measured = self.measured(windows)
        if len(measured) < self.last:
            return False
        tail = measured[-self.last:]
        return (within([w.throughput_rps for w in tail], self.tolerance_pct)
                and within([w.p99_ms for w in tail], self.tolerance_pct))

    def finished(self, windows: Sequence[Window]) -> bool:
        return self.is_stable(windows) or len(self.measured(windows)) >= self.max_windows

    def reported(self, windows: Sequence[Window]) -> Sequence[Window]:
        """The windows a point's figures come from: the last `last` measured ones."""
        return self.measured(windows)[-self.last:]


# -- rates ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rates:
    """Requests per second over one measured interval [start, end) of an open-loop point.

    offered: requests scheduled in the interval / its length (the load actually offered, not the
    nominal Poisson rate, which a finite run only approximates).
    achieved: successful answers received in the interval / its length, as in the closed loop
    (wrk2's definition). In a steady state it equals offered up to the requests in flight at the
    two edges; past capacity it is what the server sustains while its queue grows.
    unanswered: requests scheduled in the interval that had no answer when the point ended (they
    were cut after the drain time, or never sent).
    carried_in: successful answers in the interval to requests scheduled before it, so that
    achieved - carried_in / length <= offered always holds.
    """

    offered_rps: float
    achieved_rps: float
    scheduled: int
    answered_ok: int
    unanswered: int
    carried_in: int


def open_loop_rates(samples: Iterable[Sample], start: float, end: float) -> Rates:
    if end <= start:
        raise ValueError(f"empty interval [{start}, {end})")
    samples = list(samples)
    scheduled = [s for s in samples if start <= s.intended < end]
    good = [s for s in samples if s.ok and start <= s.done < end]
    unanswered = sum(1 for s in scheduled if s.status == NO_RESPONSE and s.done >= end)
    carried_in = sum(1 for s in good if s.intended < start)
    return Rates(len(scheduled) / (end - start), len(good) / (end - start), len(scheduled), len(good), unanswered,
                 carried_in)


def throughput(samples: Iterable[Sample], start: float, end: float) -> float:
    """Successful answers received per second in [start, end) (closed and open loop alike)."""
    if end <= start:
        raise ValueError(f"empty interval [{start}, {end})")
    return sum(1 for s in samples if s.ok and start <= s.done < end) / (end - start)


def late_fraction(samples: Iterable[Sample], threshold_s: float) -> float:
    """Share of requests sent more than threshold_s after their intended time."""
    samples = list(samples)
    if not samples:
        return 0.0
    return sum(1 for s in samples if s.send_lag > threshold_s) / len(samples)
