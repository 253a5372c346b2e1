"""A server plan for a mix: every model's workers x threads x batch x delay, on one core budget.

The budget: the sum over the mix's models of workers x threads is at most the machine's cores
(models outside the mix get one worker of one thread: loaded, idle, they cost memory, not CPU).
The search starts from cores shared in proportion to each model's demand (its share divided by its
capacity alone), then moves one thing at a time (benchmarks/tune/mix/search.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from benchmarks.load.mix import Mix
from benchmarks.tune.errors import TuneError
from benchmarks.tune.space import Candidate
from serving.ts_config import ModelSettings


@dataclass(frozen=True)
class MixPlan:
    """One candidate server: a Candidate per model of the mix (in the mix's order)."""

    models: tuple[tuple[str, Candidate], ...]

    @property
    def by_model(self) -> dict[str, Candidate]:
        return dict(self.models)

    @property
    def cores(self) -> int:
        return sum(c.workers * c.threads for _, c in self.models)

    @property
    def key(self) -> str:
        return "; ".join(f"{n}: {c.workers}x{c.threads} b{c.batch_size} d{c.max_batch_delay_ms}" for n, c in self.models)

    def with_model(self, name: str, candidate: Candidate) -> MixPlan:
        return MixPlan(tuple((n, candidate if n == name else c) for n, c in self.models))

    def settings(self, others: Mapping[str, ModelSettings] = {}) -> dict[str, ModelSettings]:
        """Frontend values for the launcher or the writer: the mix's models, then every other
        model of the server at one worker of one thread (its batch and delay kept)."""
        out = {n: c.settings() for n, c in self.models}
        for name, base in others.items():
            if name not in out:
                out[name] = replace(base, min_workers=1, max_workers=1, threads=1)
        return out

    def to_json(self) -> dict:
        return {n: c.to_json() for n, c in self.models}


def apportion(cores: int, demand: Mapping[str, float]) -> dict[str, int]:
    """Cores per model in proportion to demand (largest remainder), at least one each."""
    if len(demand) > cores:
        raise TuneError(f"{len(demand)} models with traffic need at least {len(demand)} cores (one worker of one "
                        f"thread each) and this machine has {cores}: serve fewer models per server")
    total = sum(demand.values()) or 1.0
    exact = {n: cores * d / total for n, d in demand.items()}
    out = {n: max(1, int(v)) for n, v in exact.items()}
    while sum(out.values()) > cores:  # the minimum of one pushed us over: take from the largest
        out[max(out, key=lambda n: out[n])] -= 1
    for name in sorted(exact, key=lambda n: exact[n] - int(exact[n]), reverse=True):
        if sum(out.values()) >= cores:
            break
        out[name] += 1
    return out


def starting_plan(mix: Mix, cores: int, alone: Mapping[str, tuple[ModelSettings, float | None]]) -> MixPlan:
    """Cores by demand (share / capacity alone; equal where a model was never tuned alone), one
    thread per worker (CPU workers scale better than threads here), each model's own batch and delay."""
    known = [cap for _, cap in alone.values() if cap]
    fallback = sum(known) / len(known) if known else 1.0
    demand = {n: mix.shares[n] / ((alone.get(n, (None, None))[1]) or fallback) for n in mix.names}
    split = apportion(cores, demand)
    models = []
    for name in mix.names:
        base = alone[name][0] if name in alone else ModelSettings(batch_size=1, max_batch_delay_ms=1)
        models.append((name, Candidate(split[name], 1, base.batch_size, base.max_batch_delay_ms)))
    return MixPlan(tuple(models))


def neighbours(plan: MixPlan, model: str, cores: int, batch_sizes: Sequence[int],
               delays: Sequence[int]) -> Iterator[MixPlan]:
    """One step from `plan` for `model`: its batch one size up or down, its delay one step up or
    down, one core taken from another model, its cores split as workers or as threads."""
    own = plan.by_model[model]
    for options, field in ((sorted(batch_sizes), "batch_size"), (sorted(delays), "max_batch_delay_ms")):
        value = getattr(own, field)
        lower = [v for v in options if v < value]
        higher = [v for v in options if v > value]
        for step in ([higher[0]] if higher else []) + ([lower[-1]] if lower else []):
            yield plan.with_model(model, replace(own, **{field: step}))
    for other, theirs in plan.models:
        if other != model and theirs.workers * theirs.threads > 1:
            taken = _fewer_cores(theirs)
            grown = replace(own, workers=own.workers + 1) if own.threads == 1 else replace(own, threads=own.threads + 1)
            yield plan.with_model(other, taken).with_model(model, grown)
    own_cores = own.workers * own.threads
    if own_cores > 1:
        for workers in (d for d in range(1, own_cores + 1) if own_cores % d == 0 and d != own.workers):
            yield plan.with_model(model, replace(own, workers=workers, threads=own_cores // workers))
    if plan.cores < cores:  # a core left over
        yield plan.with_model(model, replace(own, workers=own.workers + 1))


def _fewer_cores(candidate: Candidate) -> Candidate:
    if candidate.threads > 1:
        return replace(candidate, threads=candidate.threads - 1)
    return replace(candidate, workers=candidate.workers - 1)
