"""The mix search: from the starting plan, one move at a time, the bottleneck model first.

Every candidate is a whole server measured in the mix (benchmarks/tune/mix/measure.py), so each
costs a start and a rate search: the search takes the first neighbour that gains at least
`min_gain_pct` and stops when none does, or after `max_candidates` servers. The bottleneck is the
model furthest past its own target at the lowest failing rate: its moves are tried first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from benchmarks.load.mix import Mix, MixPoint
from benchmarks.tune.mix.measure import Capacity
from benchmarks.tune.mix.plan import MixPlan, neighbours

Progress = Callable[[str], None]
Measure = Callable[[MixPlan, float, str], Capacity]


@dataclass(frozen=True)
class SearchSettings:
    batch_sizes: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
    delays: tuple[int, ...] = (1, 2, 5, 10)
    max_candidates: int = 8
    min_gain_pct: float = 3.0

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Tried:
    plan: MixPlan
    capacity: Capacity
    move: str


def bottleneck_order(mix: Mix, capacity: Capacity) -> tuple[str, ...]:
    """The mix's models, the one that failed worst at the lowest failing rate first."""
    failing = sorted((p for p in capacity.points if not p.passes()), key=lambda p: p.rate_rps)
    point: Optional[MixPoint] = failing[0] if failing else capacity.best
    if point is None:
        return tuple(sorted(mix.names, key=lambda m: -mix.shares[m]))

    def badness(model: str) -> float:
        p99 = point.model_p99_ms(model)
        ratio = float("inf") if p99 is None else p99 / mix.slo_ms[model]
        return ratio + (0.0 if point.model_passes(model) else 1000.0)

    return tuple(sorted(mix.names, key=badness, reverse=True))


def next_start(capacity: Capacity, default_rps: float) -> float:
    """A neighbour's rate search starts at the best plan's capacity; with none, below what its
    failing points still served."""
    if capacity.rate_rps > 0:
        return capacity.rate_rps
    served = [p.achieved_rps for p in capacity.points if p.achieved_rps > 0]
    return max(1.0, min(served) / 1.25) if served else default_rps / 2


def describe_move(before: MixPlan, after: MixPlan) -> str:
    changed = [f"{n}: {before.by_model[n].label} -> {c.label}" for n, c in after.models if before.by_model[n] != c]
    return "; ".join(changed) or "start"


def search(mix: Mix, cores: int, start: MixPlan, start_rps: float, measure: Measure, settings: SearchSettings,
           progress: Progress) -> tuple[list[Tried], Tried]:
    """Every plan measured (the starting one first) and the chosen one: the last that gained."""
    tried = [Tried(start, measure(start, start_rps, "start"), "start")]
    seen = {start.key}
    best = tried[0]
    while len(tried) < settings.max_candidates:
        improved = False
        for model in bottleneck_order(mix, best.capacity):
            for plan in neighbours(best.plan, model, cores, settings.batch_sizes, settings.delays):
                if plan.key in seen or plan.cores > cores or len(tried) >= settings.max_candidates:
                    continue
                seen.add(plan.key)
                move = describe_move(best.plan, plan)
                progress(f"candidate {len(tried) + 1}/{settings.max_candidates}: {move}")
                found = Tried(plan, measure(plan, next_start(best.capacity, start_rps), f"c{len(tried) + 1}"), move)
                tried.append(found)
                if found.capacity.rate_rps > best.capacity.rate_rps * (1 + settings.min_gain_pct / 100):
                    progress(f"  gain: {best.capacity.rate_rps:.1f} -> {found.capacity.rate_rps:.1f} req/s")
                    best, improved = found, True
                    break
            if improved:
                break
        if not improved:
            break
    return tried, best
