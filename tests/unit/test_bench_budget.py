"""The bench's time budget and its scouted capacity search, on a simulated server (no TorchServe):
scouts bracket the p99 target, the bracket's passing rate is measured in full, a full point that
fails steps down, and a point that does not fit in the budget is not started but named."""

from __future__ import annotations

import pytest

from benchmarks.load.budget import Budget, BudgetSpent
from benchmarks.load.capacity import Point
from benchmarks.load.runner import LoadPlan, Measured, best_within, open_point_min_s, search_capacity
from benchmarks.load.stats import StabilityRule

pytestmark = pytest.mark.unit

SLO_MS = 50.0


def plan(**changes) -> LoadPlan:
    values = dict(levels=(1,), min_gain_pct=None, rates=(100.0,), rate_fractions=(), rule=StabilityRule(),
                  window_s=5.0, capacity_points=5, slo_ms=SLO_MS, scout_requests=300, point_requests=1000)
    return LoadPlan(**{**values, **changes})


class Server:
    """p99 grows with the rate; full-length points see a worse tail than scouts above `full_limit`."""

    def __init__(self, capacity: float, full_limit: float) -> None:
        self.capacity, self.full_limit = capacity, full_limit
        self.measured: list[tuple[float, bool]] = []

    def figures(self, rate: float, scout: bool = False) -> dict:
        limit = self.capacity if scout else self.full_limit
        p99 = 20.0 if rate <= limit else 200.0
        achieved = min(rate, self.capacity * 1.2)
        # A scout's few short windows rarely agree: the stability rule must not judge it.
        return {"mode": "open", "level": rate, "offered_rps": rate, "throughput_rps": achieved,
                "latency_ms": {"p99_ms": p99}, "stable": not scout, "errors": {}, "unanswered": 0}

    def __call__(self, rate: float, scout: bool = False) -> Point:
        self.measured.append((rate, scout))
        return Point.of(self.figures(rate, scout), scout=scout)


def test_scouts_bracket_and_the_capacity_is_a_full_point():
    server = Server(capacity=160.0, full_limit=160.0)
    listed = [server(100.0, scout=True)]
    best = search_capacity(server, listed, plan(), lambda _: None)
    assert best is not None and best.rate_rps <= 160.0
    full = [rate for rate, scout in server.measured if not scout]
    assert full == [best.rate_rps], "one full point, at the scouts' best rate"
    assert sum(scout for _, scout in server.measured) >= 3


def test_a_full_point_that_fails_is_searched_below_with_full_points():
    server = Server(capacity=160.0, full_limit=110.0)
    best = search_capacity(server, [server(100.0, scout=True)], plan(), lambda _: None)
    first_full = next(i for i, (_, scout) in enumerate(server.measured) if not scout)
    assert all(not scout for _, scout in server.measured[first_full:]), "no scout after the first full point"
    assert best is not None and 110.0 / 1.06 ** 2 <= best.rate_rps <= 110.0


def test_the_reported_capacity_is_never_a_scouts():
    server = Server(capacity=160.0, full_limit=110.0)
    # A scout whose few windows happened to agree: it passes by every rule but its length.
    points = [Measured({**server.figures(rate, scout), "scout": scout, "stable": True}, ())
              for rate, scout in ((150.0, True), (100.0, False))]
    assert Point.of(points[0].figures).passes(SLO_MS) and points[0].figures["throughput_rps"] > 100.0
    assert best_within(points, SLO_MS)["level"] == 100.0


def test_without_scouts_every_point_is_full_length():
    server = Server(capacity=160.0, full_limit=160.0)
    best = search_capacity(server, [server(100.0)], plan(scout_requests=0), lambda _: None)
    assert best is not None and not any(scout for _, scout in server.measured)


def test_a_point_that_does_not_fit_is_not_started_and_is_named():
    now = [0.0]
    budget = Budget(600.0, clock=lambda: now[0])
    need = open_point_min_s(20.0, plan(), 1000)  # 1,000 arrivals at 20 req/s: minutes
    assert need > 60
    now[0] = 600.0 - need / 2
    assert not budget.allows("ours open loop 20 req/s", need)
    with pytest.raises(BudgetSpent, match="ours open loop 20 req/s"):
        budget.require("ours open loop 20 req/s", need)
    assert budget.to_json()["left_out"][0].startswith("ours open loop 20 req/s (needs")
    assert Budget(None).allows("anything", 1e9)


def test_a_run_the_budget_cut_short_says_so_instead_of_a_miss():
    from benchmarks.bench.report import with_budget
    from benchmarks.load.runner import ServerRun

    def scout(rate, p99):
        return Measured({"mode": "open", "level": rate, "throughput_rps": rate, "scout": True,
                      "latency_ms": {"p99_ms": p99}}, ())

    ours = ServerRun("ours", (scout(211.4, 80.0), scout(169.1, 60.0), scout(135.3, 40.0)), (1,), {})
    overview = {"ours": {"slo_rps": 0.0}, "sentences": ["Ours meets p99 <= 50 ms at none of the measured rates."]}
    budget = {"budget_s": 120.0, "spent_s": 110.0, "left_out": ["ours scout 108.2 req/s (needs 21 s, 13 s left)"]}
    with_budget(overview, ours, budget, 50.0)
    assert overview["verdict"] == ("No capacity at p99 <= 50 ms: the time budget (2 min) ended the run before a "
                                   "full-length point. Its scouts (300 arrivals each) were within the target up to "
                                   "135.3 req/s and over it from 169.1 req/s.")
    assert overview["sentences"][-1].startswith("The time budget (2 min) ended the run: not measured: ours scout 108.2")
    slower = ServerRun("ours", (scout(141.5, 301.0), scout(113.2, 58.0)), (1,), {})
    cut = {"ours": {"slo_rps": 0.0}, "sentences": ["-"]}
    with_budget(cut, slower, budget, 50.0)
    assert cut["verdict"].endswith("were over the target at every rate measured, the lowest 113.2 req/s.")
    measured = {"ours": {"slo_rps": 250.0}, "sentences": ["At p99 <= 50 ms ours serves 250.0 req/s."]}
    with_budget(measured, ours, budget, 50.0)
    assert measured["sentences"][0].startswith("At p99") and len(measured["sentences"]) == 2
