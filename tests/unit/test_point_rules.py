"""What one measured point may claim: late requests count in its p99, an unstable point sets no
capacity, and a p99 near the SLO is measured again until the median decides. Synthetic samples and
scripted measurers only (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.load import resources, server_metrics, stats
from benchmarks.load.capacity import Point, RateSettings, find_max_rate
from benchmarks.load.loadgen import LoadResult
from benchmarks.load.mix import Mix, MixPoint, model_figures
from benchmarks.load.runner import Measured, best_within, point
from benchmarks.load.stats import NO_RESPONSE, Sample, StabilityRule
from benchmarks.tune.space import Candidate

pytestmark = pytest.mark.unit

WINDOW_S = 10.0


def _probe_reading(t: float):
    usage = resources.Reading(t, {"frontend": 0.0, "workers": 0.0, "machine": 0.0},
                              {"frontend": 0, "workers": 0, "machine": 0})
    return server_metrics.Scrape.of(""), usage


def _open_result(samples, stable: bool = True, mode: str = "open") -> LoadResult:
    """One reported window [10, 20) after a warm-up window [0, 10)."""
    rule = StabilityRule(tolerance_pct=10.0, last=1, max_windows=1, warmup=1)
    windows = (stats.window(samples, 0.0, 10.0), stats.window(samples, 10.0, 20.0))
    edges = tuple((t, _probe_reading(t)) for t in (0.0, 10.0, 20.0))
    return LoadResult(mode, 100.0, tuple(samples), windows, edges, stable, rule, connections=64)


def _saturating_samples(tag: str = ""):
    """100 req/s scheduled in [10, 20): 980 answered in 10 ms, 10 answered after the interval
    ended (2 s late), 10 never answered (cut after the drain, 30 s later)."""
    out = [Sample(5.0 + i / 100, 5.0 + i / 100, 5.0 + i / 100 + 0.01, 200, tag) for i in range(500)]  # warm-up
    for i in range(1000):
        t = 10.0 + i / 100
        if i < 980:
            out.append(Sample(t, t, t + 0.010, 200, tag))
        elif i < 990:
            out.append(Sample(t, t, t + 2.0, 200, tag))  # answered at ~22 s: after the interval
        else:
            out.append(Sample(t, t, 50.0, NO_RESPONSE, tag))  # waited ~30 s, then cut
    return out


# -- late requests count in an open-loop p99 ------------------------------------------------------
def test_an_open_loop_p99_counts_the_requests_still_in_flight_at_the_end():
    figures = _open_result(_saturating_samples()).figures()
    latency = figures["latency_ms"]
    # Every request scheduled in the interval: the 980 quick ones, the 10 answered late and the
    # 10 never answered (counted by their wait, at least one window).
    assert latency["count"] == 1000
    assert latency["p99_ms"] >= 2000.0  # 2% of the requests took 2 s or more
    assert latency["max_ms"] >= WINDOW_S * 1000
    assert figures["unanswered"] == 10 and figures["errors"] == {}  # cut requests are waits, not errors


def test_an_unanswered_request_counts_at_least_one_window():
    cut_early = Sample(19.9, 19.9, 20.5, NO_RESPONSE)  # given up 0.6 s after it was due
    chosen = stats.select([cut_early], "open", 10.0, 20.0, WINDOW_S)
    assert chosen.latencies_s == (WINDOW_S,) and chosen.unanswered == 1


def test_errors_are_counted_as_errors_not_latencies():
    samples = [Sample(10.0, 10.0, 10.01, 200), Sample(11.0, 11.0, 11.02, 503),
               Sample(12.0, 12.0, 12.001, NO_RESPONSE)]  # refused at once, inside the interval
    chosen = stats.select(samples, "open", 10.0, 20.0, WINDOW_S)
    assert chosen.latencies_s == pytest.approx((0.01,)) and chosen.errors == {"0": 1, "503": 1}
    assert chosen.unanswered == 0


def test_the_closed_loop_keeps_the_requests_answered_in_the_interval():
    samples = [Sample(9.5, 9.5, 10.5, 200), Sample(19.5, 19.5, 20.5, 200), Sample(12.0, 12.0, 12.1, 200)]
    chosen = stats.select(samples, "closed", 10.0, 20.0, WINDOW_S)
    assert chosen.latencies_s == pytest.approx((1.0, 0.1))


def test_figures_and_the_cdf_plot_count_the_same_requests():
    result = _open_result(_saturating_samples())
    served = point(result, "m")
    latency = served.figures["latency_ms"]
    assert len(served.latencies_ms) == latency["count"]
    assert stats.percentile(served.latencies_ms, 99.0) == pytest.approx(latency["p99_ms"])
    assert served.latencies_ms[-1] == pytest.approx(latency["max_ms"])


def test_a_mixed_points_models_count_their_late_requests_too():
    result = _open_result(_saturating_samples("a") + [Sample(15.0, 15.0, 15.005, 200, "b")])
    alone = _open_result(_saturating_samples()).figures()["latency_ms"]
    own = model_figures(result, "a")
    assert own["latency_ms"]["count"] == 1000 and own["unanswered"] == 10
    assert own["latency_ms"]["p99_ms"] == pytest.approx(alone["p99_ms"])


# -- an unstable point sets no capacity -----------------------------------------------------------
def _figures(rps: float, p99: float, stable: bool) -> dict:
    return {"mode": "open", "level": rps, "throughput_rps": rps, "offered_rps": rps, "stable": stable,
            "latency_ms": {"p99_ms": p99, "count": 2000}, "errors": {}, "unanswered": 0}


def test_an_unstable_passing_point_sets_no_bench_capacity():
    stable, unstable = _figures(200.0, 30.0, True), _figures(300.0, 40.0, False)
    assert not Point.of(unstable).passes(50.0)
    assert best_within([Measured(stable, ()), Measured(unstable, ())], 50.0) is stable


def test_the_rate_search_never_takes_an_unstable_point_as_its_capacity():
    def probe(rate: float) -> Point:  # within the SLO up to 260 req/s, unstable from 200
        return Point.of(_figures(rate, 30.0 if rate <= 260 else 90.0, stable=rate < 200))

    found = find_max_rate(probe, 100.0, 50.0, RateSettings(max_points=8))
    assert found.best is not None and found.best.rate_rps < 200.0
    assert any(p.rate_rps >= 200.0 and p.p99_ms <= 50.0 for p in found.points)  # measured, not counted


def test_an_unstable_mixed_point_does_not_pass():
    mix = Mix({"a": 1.0}, {"a": 5000.0})
    quiet = [s for s in _saturating_samples("a") if s.ok and s.latency < 1.0]  # every model within target
    assert MixPoint.of(_open_result(quiet), mix).passes()
    assert not MixPoint.of(_open_result(quiet, stable=False), mix).passes()


def test_an_unstable_tuner_point_does_not_pass():
    def at(rate: float, stable: bool) -> Point:
        return Point("w2-t1-b4-d1", rate, rate, rate, 10.0, 40.0, 0, seconds=1.0, stable=stable)

    assert at(100.0, True).passes(50.0) and not at(100.0, False).passes(50.0)
    found = find_max_rate(lambda rate: at(rate, stable=rate < 150.0), 100.0, 50.0, RateSettings(max_points=6))
    assert found.best.rate_rps < 150.0


# -- a p99 near the SLO is measured again, on either side ----------------------------------------
def _scripted(p99s, slo_ms: float = 50.0):
    from benchmarks.tune.measure import LoadSettings, ServedMeasurer, ServePlan

    plan = ServePlan("m", Path("store"), Path("config.properties"), LoadSettings(window_s=2.0), slo_ms=slo_ms)
    measurer = ServedMeasurer(plan, progress=lambda line: None)
    script, calls = list(p99s), []

    def fake_measure(candidate, rate, overhead):
        calls.append(plan.load.window_at(rate))
        return Point(candidate.key, rate, rate, rate, 10.0, script.pop(0), 0, seconds=8.0, overhead_s=overhead)

    measurer._start = lambda candidate: 5.0
    measurer._measure = fake_measure
    return measurer, calls


@pytest.mark.parametrize("p99s, final", [
    ((45.0, 55.0, 52.0), 52.0),  # a near pass: measured twice more, the median fails it
    ((45.0, 44.0, 70.0), 45.0),  # ... or passes it
    ((55.0, 48.0, 44.0), 48.0),  # a near miss, the same
    ((60.0, 65.0, 61.0), 61.0),
])
def test_a_p99_near_the_slo_is_measured_again_and_the_median_decides(p99s, final):
    measurer, calls = _scripted(p99s)
    decided = measurer.measure("search", Candidate(2, 1, 4, 2), 100.0)
    # Three points of the same length (2,000 arrivals over 3 windows at 100 req/s: 6.7 s windows).
    assert calls == pytest.approx([2000 / 300] * 3) and decided.p99_ms == final
    assert decided.seconds == 8.0 * 3 and decided.overhead_s == 5.0
    assert sorted(decided.remeasured_p99_ms) == sorted(p99s)


def test_a_near_point_is_not_measured_again_past_the_time_budget():
    from benchmarks.load.budget import Budget

    now = [0.0]
    measurer, calls = _scripted((45.0, 55.0, 52.0))
    measurer.budget = Budget(20.0, clock=lambda: now[0])  # two more points of 8 s: 16 s
    assert measurer.measure("search", Candidate(2, 1, 4, 2), 100.0).p99_ms == 52.0 and len(calls) == 3
    measurer, calls = _scripted((45.0, 55.0, 52.0))
    measurer.budget = Budget(20.0, clock=lambda: now[0])
    now[0] = 5.0  # 15 s left
    decided = measurer.measure("search", Candidate(2, 1, 4, 2), 100.0)
    assert (decided.p99_ms, len(calls)) == (45.0, 1)
    assert measurer.budget.to_json()["left_out"][0].startswith("re-measuring ")


@pytest.mark.parametrize("p99", [30.0, 120.0])
def test_a_p99_far_from_the_slo_is_measured_once(p99):
    measurer, calls = _scripted((p99,))
    assert measurer.measure("search", Candidate(2, 1, 4, 2), 100.0).p99_ms == p99 and len(calls) == 1
