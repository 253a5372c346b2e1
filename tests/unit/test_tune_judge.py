"""The referee between the search's pick and the grid's best (no server: a scripted measurer)."""

from __future__ import annotations

import pytest

from benchmarks.tune.judge import head_to_head
from benchmarks.tune.report import grid_comparison
from benchmarks.tune.results import CandidateResult, Point
from benchmarks.tune.search import SearchResult
from benchmarks.tune.space import Candidate

pytestmark = pytest.mark.unit

SLO_MS = 50.0
PICK = Candidate(2, 1, 8, 2)
BEST = Candidate(2, 1, 2, 30)


class Capacities:
    """A measurer: each candidate passes the SLO below its capacity and fails above; records the
    call order and every stop of a candidate's server."""

    def __init__(self, capacity: dict) -> None:
        self.capacity = capacity
        self.calls = []
        self.finished = 0

    def finish(self) -> None:
        self.finished += 1

    def measure(self, phase: str, candidate: Candidate, rate: float) -> Point:
        self.calls.append(candidate.key)
        ok = rate <= self.capacity[candidate.key]
        return Point(candidate.key, rate, rate, rate, 10.0, 30.0 if ok else 90.0, 0, seconds=10.0)


def result(candidate: Candidate, rps: float, phase: str = "grid") -> CandidateResult:
    best = Point(candidate.key, rps, rps, rps, 10.0, 40.0, 0, seconds=10.0) if rps > 0 else None
    return CandidateResult(candidate, phase, (best,) if best else (), best, rps)


def test_head_to_head_alternates_and_compares_means():
    server = Capacities({PICK.key: 300.0, BEST.key: 310.0})
    judged = head_to_head(result(PICK, 231.0, "search"), result(BEST, 366.0), SLO_MS, server,
                          progress=lambda line: None)
    assert judged is not None
    # ABBA: pick, best, best, pick; each rate search stops its server
    order = [k for i, k in enumerate(server.calls) if i == 0 or server.calls[i - 1] != k]
    assert order == [PICK.key, BEST.key, PICK.key]  # the middle two are one run of BEST
    assert server.finished == 4
    assert judged.start_rps == pytest.approx((231.0 * 366.0) ** 0.5)
    # Both found within the ladder's resolution (1.06) below their true capacity
    assert all(300.0 / 1.06 <= r.throughput_rps <= 300.0 for r in judged.pick)
    assert all(310.0 / 1.06 <= r.throughput_rps <= 310.0 for r in judged.best)
    assert judged.share == pytest.approx(judged.pick_rps / judged.best_rps)
    assert [r.phase for r in judged.pick] == ["judge-1", "judge-2"]


def test_nothing_to_judge_when_the_pick_is_the_grids_best():
    server = Capacities({PICK.key: 300.0})
    same = Candidate(2, 1, 8, 2)
    assert head_to_head(result(PICK, 231.0), result(same, 275.0), SLO_MS, server,
                        progress=lambda line: None) is None
    assert server.calls == []


def search_result(pick: CandidateResult, seconds: float) -> SearchResult:
    timed = CandidateResult(pick.candidate, "search", (Point(pick.candidate.key, 1, 1, 1, 1, 1, 0, seconds),),
                            pick.best, pick.start_rps)
    chosen = CandidateResult(pick.candidate, "search", timed.points + pick.points, pick.best, pick.start_rps)
    return SearchResult((chosen,), chosen, "test", None, (), ())


def test_verdict_judges_the_choice_not_one_noisy_reading():
    grid = [result(PICK, 350.0), result(BEST, 366.0), result(Candidate(1, 2, 8, 2), 40.0)]
    searched = search_result(result(PICK, 231.0, "search"), seconds=100.0)
    # Without a referee: the grid's own reading of the pick decides (350/366 = 96%), not the search's (63%)
    plain = grid_comparison(searched, 14.0, grid)
    assert plain["share_of_best"] == pytest.approx(231.0 / 366.0)
    assert plain["decisive_share"] == pytest.approx(350.0 / 366.0)
    assert plain["targets_met"] == (plain["share_of_time"] <= 0.15)
    # With one, the head-to-head decides
    server = Capacities({PICK.key: 250.0, BEST.key: 320.0})
    judged = head_to_head(searched.chosen, grid[1], SLO_MS, server, progress=lambda line: None)
    verdict = grid_comparison(searched, 14.0, grid, judged)
    assert verdict["decisive_share"] == pytest.approx(judged.share) and judged.share < 0.95
    assert verdict["targets_met"] is False and "NOT met" in verdict["sentence"]
    assert verdict["head_to_head"]["order"] == "ABBA" and len(verdict["head_to_head"]["results"]) == 4
