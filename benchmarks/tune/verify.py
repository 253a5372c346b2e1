"""After writing: does the file do what the tuner claims, and what does it serve?

TorchServe is restarted from the written config.properties itself (through the launcher, which
only moves the addresses to free ports), not from values the tuner passes in: this checks that
the frontend reads the new stanza (GET /models/<name> shows the written batch size, delay and
workers, and each worker logs the expected thread count). Then the capacity is measured again,
from the search's rate, with the benchmark's own open-loop point and rate search
(benchmarks.load.capacity: REFERENCE_WINDOW_S windows, the benchmark's stability rule unless
--verify-stability-pct says otherwise) after a long
warm-up: the search ranks candidates with shorter points, but the figure written into the
provenance record is this one, the one `make bench` on the written values measures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Optional

from benchmarks.load import stats
from benchmarks.load.capacity import REFERENCE_WINDOW_S, RateSettings, find_max_rate
from benchmarks.load.stats import StabilityRule
from benchmarks.tune.measure import ServedMeasurer, ServePlan
from benchmarks.tune.results import Point
from benchmarks.tune.space import Candidate
from build.catalogue import FRONTEND_KEYS
from serving.repo import shown

Progress = Callable[[str], None]
# From the search's rate, small steps: it is near the capacity already.
VERIFY_STEP = 1.1


@dataclass(frozen=True)
class VerifySettings:
    points: int = 5  # the capacity search's points at most
    # Unmeasured load after the start: a server that has served for a while (JIT, allocator,
    # caches) is what users run, and what the benchmark measures after its closed-loop sweep.
    warmup_s: float = 30.0
    # The benchmark's rule by default, so that the figure is the one `make bench` measures.
    stability_pct: float = StabilityRule.tolerance_pct


@dataclass(frozen=True)
class Verification:
    config: str
    described: dict  # the frontend's view of the model
    mismatches: tuple[str, ...]
    worker_threads: tuple[int, ...]
    points: tuple[Point, ...]
    slo_ms: float
    seconds: float

    @property
    def confirmed(self) -> Optional[Point]:
        """The highest passing rate: the capacity from the written file."""
        return max((p for p in self.points if p.passes(self.slo_ms)), key=lambda p: p.rate_rps, default=None)

    @property
    def passed(self) -> bool:
        return not self.mismatches and self.confirmed is not None

    def summary(self) -> str:
        if self.mismatches:
            return "verification FAILED: " + "; ".join(self.mismatches)
        if self.confirmed is None:
            lowest = min(self.points, key=lambda p: p.rate_rps, default=None)
            if lowest is None:
                return "verification FAILED: no point measured"
            if not lowest.stable and lowest.p99_ms is not None and lowest.p99_ms <= self.slo_ms:
                return (f"verification FAILED: unstable at {lowest.rate_rps:.1f} req/s (an unstable point sets "
                        "no capacity)")
            return (f"verification FAILED: {stats.tail_text(lowest.latency)} against the SLO at "
                    f"{lowest.rate_rps:.1f} req/s")
        return "verified from the written file"

    def to_json(self) -> dict:
        return {"config": self.config, "described": self.described, "mismatches": list(self.mismatches),
                "worker_threads": list(self.worker_threads), "points": [p.to_json() for p in self.points],
                "passed": self.passed, "summary": self.summary(), "seconds": round(self.seconds, 2)}

    @classmethod
    def from_json(cls, raw: dict, slo_ms: float) -> Verification:
        return cls(raw["config"], raw["described"], tuple(raw["mismatches"]), tuple(raw["worker_threads"]),
                   tuple(Point.from_json(p) for p in raw["points"]), slo_ms, raw["seconds"])


def verify(plan: ServePlan, chosen: Candidate, rate_rps: float, settings: VerifySettings = VerifySettings(),
           resolution: float = 1.06, progress: Progress = print) -> Verification:
    """TorchServe from `plan.config` as written (never the candidate's values swapped in)."""
    began = time.perf_counter()
    model = plan.model
    progress(f"verification: TorchServe from {shown(plan.config)}, capacity search from {rate_rps:.1f} req/s")
    load = replace(plan.load, window_s=REFERENCE_WINDOW_S, rule=StabilityRule(tolerance_pct=settings.stability_pct),
                   warmup_s=settings.warmup_s)
    # The benchmark measures each point once: so does this, to reproduce its figure.
    plan = replace(plan, from_file=True, load=load, remeasure_near_slo=False)
    described, threads = {}, ()
    with ServedMeasurer(plan, progress) as measurer:
        def probe(rate: float) -> Point:
            nonlocal described, threads
            point = measurer.measure("verify", chosen, rate)  # starts the server on its first point
            if not described:
                described = measurer.server.describe(model)
                threads = tuple(measurer.worker_threads.get(chosen.key, ()))
            return point

        rates = RateSettings(step=VERIFY_STEP, resolution=resolution, max_points=settings.points)
        found = find_max_rate(probe, rate_rps, plan.slo_ms, rates)
    mismatches = tuple(f"GET /models/{model} shows {m} from the written file"
                       for m in chosen.settings().mismatches(described))
    if len(threads) != chosen.workers or set(threads) != {chosen.threads}:  # none logged is a failure too
        mismatches += (f"workers logged intra-op threads {list(threads)}, expected {chosen.threads} from each "
                       f"of {chosen.workers}",)
    kept = {k: described.get(k) for k in ("modelVersion", *FRONTEND_KEYS)}
    kept["workers"] = len(described.get("workers") or ())
    result = Verification(shown(plan.config), kept, mismatches, threads, tuple(found.points), plan.slo_ms,
                          time.perf_counter() - began)
    progress(f"verification: {result.summary()}")
    return result
