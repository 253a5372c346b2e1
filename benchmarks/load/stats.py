"""Arithmetic on client-side timings: percentiles, windows, rates and the stability rule.

Pure functions over `Sample`s (no clock, no I/O), so the unit tests can feed synthetic timings.

Latency is always measured from a request's *intended* send time: in the closed loop that is the
moment it was sent; in the open loop it is its scheduled Poisson arrival, so a request that had to
wait for a free connection (or for a slow generator) is charged for the wait (no coordinated
omission).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
NO_RESPONSE = 0  # status of a request that got no HTTP answer (connection error or client timeout)
# A p99 printed in a report rests on at least this many samples: then ten of them lie beyond it,
# and one stray pause moves it by a tenth of the tail instead of being the tail. Below it a
# report prints the p90 and the sample count instead (`tail_text`).
P99_MIN_SAMPLES = 1000


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

    def tail(self, digits: int = 1, unit: str = " ms") -> str:
        """The p99 as a report prints it (`tail_text`)."""
        return tail_text(self, digits, unit)


def supports(q: float, count: Optional[int]) -> bool:
    """May a report print percentile q of `count` samples? Only with as many samples beyond it as a
    p99 over P99_MIN_SAMPLES has (a p99.9 then needs ten times as many). None (not recorded): no."""
    return count is not None and round(count * (100.0 - q), 6) >= P99_MIN_SAMPLES


def tail_name(*counts: Optional[int]) -> str:
    """"p99" when every sample set supports one, else "p90": the tail percentile a report compares.
    A set whose size was not recorded (None) keeps its p99, as in tail_text."""
    return "p99" if all(n is None or supports(99.0, n) for n in counts) else "p90"


Latency = Union[LatencySummary, Mapping[str, Any], None]


def tail_text(latency: Latency, digits: int = 1, unit: str = " ms", label: bool = True) -> str:
    """The tail of a sample set as every report line prints it: "p99 12.3 ms" over at least
    P99_MIN_SAMPLES samples, else "p90 12.3 ms (n=640)"; a set whose size was not recorded keeps its
    p99 and says so. `latency`: a LatencySummary or its JSON (count, p90_ms, p99_ms). label False:
    a p99 cell of a table (its header names the percentile and the unit): "12.3", or "p90 12.3 (n=640)"."""
    count, p90, p99 = _tail_figures(latency)
    if p99 is None:
        return "-"
    if count is None:
        return f"{'p99 ' if label else ''}{p99:.{digits}f}{unit} (n not recorded)"
    if supports(99.0, count):
        return f"{'p99 ' if label else ''}{p99:.{digits}f}{unit}"
    if p90 is None:
        return f"- (n={count})"
    return f"p90 {p90:.{digits}f}{unit} (n={count})"


def tail_cell(latency: Latency, digits: int = 1) -> str:
    """`tail_text` for a table's p99 column."""
    return tail_text(latency, digits, unit="", label=False)


def tail_ratio(over: Latency, under: Latency, digits: int = 2) -> str:
    """One sample set's tail over another's: "p99: 1.05x" when both support a p99, else the p90s'
    ratio with both counts, "p90 (n=200 / 200): 1.03x"."""
    (n_over, p90_over, p99_over), (n_under, p90_under, p99_under) = _tail_figures(over), _tail_figures(under)
    if tail_name(n_over, n_under) == "p99":
        a, b, name = p99_over, p99_under, "p99"
    else:
        a, b, name = p90_over, p90_under, f"p90 (n={n_over} / {n_under})"
    return f"{name}: {a / b:.{digits}f}x" if a is not None and b else f"{name}: -"


def _tail_figures(latency: Latency) -> tuple[Optional[int], Optional[float], Optional[float]]:
    if latency is None:
        return None, None, None
    get = latency.get if isinstance(latency, Mapping) else lambda key: getattr(latency, key, None)
    return get("count"), get("p90_ms"), get("p99_ms")


def summarize(latencies_s: Iterable[float]) -> Optional[LatencySummary]:
    values = sorted(latencies_s)
    if not values:
        return None
    ms = [v * 1000.0 for v in values]
    p50, p90, p95, p99, p999 = (percentile(ms, q) for q in PERCENTILES)
    return LatencySummary(len(ms), sum(ms) / len(ms), p50, p90, p95, p99, p999, ms[-1])


def errors_by_status(samples: Iterable[Sample]) -> dict[str, int]:
    """Failed requests per status ("0" = no HTTP answer), as JSON-friendly string keys."""
    out: dict[str, int] = {}
    for sample in samples:
        if not sample.ok:
            out[str(sample.status)] = out.get(str(sample.status), 0) + 1
    return dict(sorted(out.items()))


# -- which requests a point's figures are over --------------------------------------------------
@dataclass(frozen=True)
class Selection:
    """The requests of one measured interval that its latency figures, its CDF and its errors count."""

    requests: tuple[Sample, ...]
    latencies_s: tuple[float, ...]  # answered ones' latencies, then the unanswered ones' waits
    errors: dict[str, int]  # answered with an error, or failed at once without an answer (errors_by_status)
    unanswered: int  # in flight when the point ended and never answered: in latencies_s by their wait


def unanswered_at(sample: Sample, end: float) -> bool:
    """No answer, and no failure before the interval ended: in flight at its end, then cut after the
    drain (or never sent). open_loop_rates counts these as unanswered; select counts their waits."""
    return sample.status == NO_RESPONSE and sample.done >= end


def select(samples: Iterable[Sample], mode: str, start: float, end: float, window_s: float) -> Selection:
    """The one selection every latency figure of a point comes from (its summary, its CDF plot,
    each model's share of a mix).

    Open loop: every request *scheduled* in [start, end), answered or not. Taking those answered
    in the interval instead would drop the ones still queued at its end, the slowest, and lower the
    p99 exactly where a server falls behind. A successful request counts its latency from its
    intended time; one never answered counts the time it was waited for, and at least `window_s`
    (the load generator gives up on it only after a drain at least that long, or never sends it);
    one answered with an error counts as an error, not a latency.
    Closed loop: the requests answered in [start, end) (each client sends only after its last
    answer, so nothing is left in flight to miss).
    """
    samples = list(samples)
    if mode == "open":
        chosen = [s for s in samples if start <= s.intended < end]
        cut = [s for s in chosen if unanswered_at(s, end)]
    else:
        chosen = [s for s in samples if start <= s.done < end]
        cut = []
    latencies = [s.latency for s in chosen if s.ok] + [max(s.latency, window_s) for s in cut]
    failed = [s for s in chosen if not s.ok and not (mode == "open" and unanswered_at(s, end))]
    return Selection(tuple(chosen), tuple(latencies), errors_by_status(failed), len(cut))


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
    p90_ms: Optional[float] = None  # printed instead of a thin p99 (tail_text)

    @property
    def latency(self) -> dict:
        """Its answers' tail as tail_text reads it."""
        return {"count": self.ok, "p90_ms": self.p90_ms, "p99_ms": self.p99_ms}


def window(samples: Iterable[Sample], start: float, end: float) -> Window:
    inside = [s for s in samples if start <= s.done < end]
    good = sorted(s.latency * 1000.0 for s in inside if s.ok)
    duration = end - start
    if duration <= 0:
        raise ValueError(f"empty window [{start}, {end})")
    return Window(start, end, len(inside), len(good), len(good) / duration,
                  percentile(good, 99.0) if good else None, percentile(good, 90.0) if good else None)


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
    unanswered = sum(1 for s in scheduled if unanswered_at(s, end))
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
