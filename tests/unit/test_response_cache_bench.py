"""The response-cache benchmark: its all-distinct workload (every arm and every point gets the same mix),
its search floor and its report text."""

import numpy as np
import pytest

from benchmarks.bench.response_cache import IDLE_DIVISOR, descent_floor, distinct_texts
from benchmarks.bench.response_cache_report import capacity_text
from benchmarks.load.capacity import RateSettings, find_max_rate

pytestmark = pytest.mark.unit


def _pool() -> list[str]:
    # Sentences whose length grows by region, as Python's documentation topics do.
    return [f"sentence {i} " + "word " * (5 + i // 50) for i in range(400)]


def test_all_distinct_texts_are_distinct_and_mixed_evenly():
    texts = distinct_texts(_pool(), 40_000, seed=0)
    assert len(set(texts)) == len(texts) == 40_000
    means = [np.mean([len(t) for t in texts[i:i + 2000]]) for i in range(0, len(texts), 2000)]
    # Consecutive blocks (one arm's point, the next arm's) cost the same per request within 3%.
    assert max(means) / min(means) < 1.03


def test_too_few_sentences_for_the_count_is_refused():
    with pytest.raises(SystemExit, match="lower --distinct"):
        distinct_texts(["a", "b", "c"], 10, seed=0)


class _Failing:
    """An open-loop point whose tail misses the SLO at any rate: the service time is over it."""

    def __init__(self, rate: float) -> None:
        self.rate_rps = self.offered_rps = self.achieved_rps = rate
        self.p99_ms, self.stable = 150.0, True

    def passes(self, slo_ms: float) -> bool:
        return False


def test_a_search_that_never_passes_stops_at_an_eighth_of_its_start():
    rates = []

    def probe(rate: float) -> _Failing:
        rates.append(rate)
        return _Failing(rate)

    start = 44.0
    search = find_max_rate(probe, start, 50.0, descent_floor(start, RateSettings(max_points=7)))
    print("rates probed:", [round(r, 1) for r in rates])
    assert search.best is None
    assert min(rates) >= start / IDLE_DIVISOR
    assert len(rates) < 7


def test_the_report_says_how_low_a_search_that_never_passed_went():
    never = {"capacity_rps": 0, "floor": False, "points": [{"offered_rps": 37.5}, {"offered_rps": 4.7}]}
    assert capacity_text(never) == "none of the measured rates (down to 4.7 req/s)"
    assert capacity_text({"capacity_rps": 21.0, "floor": False, "points": []}) == "21.0 req/s"
