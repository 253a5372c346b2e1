"""Judging the search against the grid when one grid run cannot.

On this machine one candidate's highest rate within the SLO moves by 20% and more from one run
to the next (2 workers x 1 thread, batch 2, delay 2 ms: 253 req/s in one grid, 314 in the next),
far more than the 5% the efficiency target allows. Which of two close candidates wins a single
grid is then partly the dice. So when the search's pick is not the grid's best, the two are
measured again head to head: the same rate ladder from the same start, in ABBA order (pick,
best, best, pick) so a drift of the machine during the judgement hits both alike, and the means
compared. Neither side's measurement time counts: this is the referee, not the search.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from benchmarks.load.capacity import RateSettings
from benchmarks.tune.rates import Measurer
from benchmarks.tune.results import CandidateResult
from benchmarks.tune.search import Fixed, Progress, Proposal, run

JUDGE_ROUNDS = 2


@dataclass(frozen=True)
class HeadToHead:
    pick: tuple[CandidateResult, ...]
    best: tuple[CandidateResult, ...]
    start_rps: float

    @staticmethod
    def _mean(results: Sequence[CandidateResult]) -> float:
        return sum(r.throughput_rps for r in results) / len(results)

    @property
    def pick_rps(self) -> float:
        return self._mean(self.pick)

    @property
    def best_rps(self) -> float:
        return self._mean(self.best)

    @property
    def share(self) -> float:
        return self.pick_rps / self.best_rps if self.best_rps > 0 else math.inf

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.pick + self.best)

    def to_json(self) -> dict:
        return {"pick_key": self.pick[0].candidate.key, "best_key": self.best[0].candidate.key,
                "start_rps": round(self.start_rps, 3), "pick_rps": [r.throughput_rps for r in self.pick],
                "best_rps": [r.throughput_rps for r in self.best], "pick_mean_rps": self.pick_rps,
                "best_mean_rps": self.best_rps, "share": self.share, "seconds": round(self.seconds, 1),
                "rounds": len(self.pick), "order": "ABBA",
                "results": [r.to_json() for pair in zip(self.pick, self.best) for r in pair]}


def head_to_head(pick: Optional[CandidateResult], best: Optional[CandidateResult], slo_ms: float,
                 measurer: Measurer, progress: Progress, rounds: int = JUDGE_ROUNDS,
                 rates: RateSettings = RateSettings()) -> Optional[HeadToHead]:
    """None when there is nothing to judge (no pick, no grid best, or they behave the same)."""
    if pick is None or best is None or pick.candidate.behaviour == best.candidate.behaviour:
        return None
    if pick.throughput_rps <= 0 or best.throughput_rps <= 0:
        return None
    # One start for both, between their earlier results: neither ladder starts at the other's answer.
    start = math.sqrt(pick.throughput_rps * best.throughput_rps)
    picks, bests = [], []
    for index in range(rounds):
        order = (pick, best) if index % 2 == 0 else (best, pick)  # ABBA
        progress(f"head to head {index + 1}/{rounds}: " + ", then ".join(
            f"{'pick' if side is pick else 'grid best'} {side.candidate.key}" for side in order))
        judged = run(Fixed([Proposal(side.candidate, start) for side in order], f"judge-{index + 1}", rates),
                     measurer, slo_ms, progress)
        for side, result in zip(order, judged.results):
            (picks if side is pick else bests).append(result)
    return HeadToHead(tuple(picks), tuple(bests), start)
